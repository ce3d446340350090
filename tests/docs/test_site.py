"""The documentation: the site builds strictly, generated pages match the code, the README
is a first screen that carries CI's test command, and its links lead somewhere."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docs.gen import settings_notes
from docs.gen.settings import Undocumented, descriptions
from tasks.platform.config import Settings
from tests.support.stack import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
# pymdownx.snippets' include marker, as written (--8<--) or spaced out by a code formatter
SNIPPET_MARKER = re.compile(r"-{2,}\s*8\s*<\s*-{2,}")


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # a notice about Material's future, not about the site
    return subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists (paths under docs/)."""

    def pages(entries: list) -> list[str]:
        found = []
        for entry in entries:
            for value in entry.values():
                found += pages(value) if isinstance(value, list) else [value]
        return found

    return pages(yaml.safe_load((PROJECT_ROOT / "mkdocs.yml").read_text())["nav"])


def ci_test_command() -> str:
    """The command ``.ci/run`` runs: from ``python3 -m venv`` to the end of its line or
    the ``;`` that ends it (a group around it, such as one whose output is logged)."""
    script = (PROJECT_ROOT / ".ci" / "run").read_text()
    (command,) = re.findall(r"python3 -m venv [^;\n]*", script)
    return command.strip()


def text_of(fragment: str) -> str:
    """What a reader sees of an HTML fragment: no comments, no tags, entities decoded."""
    fragment = re.sub(r"<!--.*?-->", "", fragment, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def code_blocks(page: Path) -> list[str]:
    """The text of each code block (``<pre>``) of a built page."""
    return [text_of(b) for b in re.findall(r"<pre\b[^>]*>(.*?)</pre>", page.read_text(), re.S)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module's tests."""
    folder = tmp_path_factory.mktemp("site")
    # strict: a broken link or anchor, a page left out of the nav, a missing include fails
    built = run("-m", "mkdocs", "build", "--strict", "--site-dir", str(folder))
    assert built.returncode == 0, built.stdout + built.stderr
    return folder


def built_pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if p.parent.name != "404")


def test_the_site_builds_with_no_warning(site: Path):
    assert (site / "quickstart" / "index.html").is_file()
    assert len(built_pages(site)) == len(nav_pages())


def test_every_include_is_rendered(site: Path):
    # A snippet marker a formatter spaced out (--8 < --) is no include: the page would show
    # the marker itself, and a strict build does not notice
    for page in built_pages(site):
        shown = SNIPPET_MARKER.search(text_of(page.read_text()))
        assert shown is None, f"{page.relative_to(site)} shows {shown and shown[0]!r}"
        empty = [n for n, code in enumerate(code_blocks(page), 1) if not code.strip()]
        assert not empty, f"{page.relative_to(site)}: code block(s) {empty} show nothing"


def test_the_quickstart_shows_its_module(site: Path):
    module = (PROJECT_ROOT / "examples" / "hello_jobs.py").read_text().strip()
    assert "def greet" in module
    shown = code_blocks(site / "quickstart" / "index.html")
    assert any(module in code for code in shown), "no code block holds examples/hello_jobs.py"


def test_the_generated_pages_are_what_the_code_generates():
    checked = run("-m", "docs.gen", "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_setting_without_a_description_stops_the_generator():
    class WithANewSetting(Settings):
        brand_new_interval_s: float = 3

    with pytest.raises(Undocumented, match="KEEL_BRAND_NEW_INTERVAL_S"):
        descriptions(WithANewSetting)

    class Commented(Settings):
        # How often nothing happens.
        brand_new_interval_s: float = 3

    assert descriptions(Commented)["brand_new_interval_s"] == "How often nothing happens."


def test_a_note_for_a_setting_that_is_gone_stops_the_generator(monkeypatch):
    monkeypatch.setitem(settings_notes.NOTES, "gone_setting", "It was here.")
    with pytest.raises(Undocumented, match="gone_setting"):
        descriptions(Settings)


def test_the_readme_is_a_first_screen():
    assert len(README.read_text().splitlines()) <= 150


def test_the_readme_carries_the_test_command_ci_runs_unchanged():
    command = ci_test_command()
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert any(command in block.splitlines() for block in blocks), command


def test_the_readme_links_lead_to_published_pages():
    published = set(nav_pages())
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t]
    assert targets
    for target in targets:
        path = (PROJECT_ROOT / target.split("#")[0]).resolve()
        assert path.exists(), target
        if path.is_relative_to(DOCS) and path.suffix == ".md":
            assert path.relative_to(DOCS).as_posix() in published, target


def test_the_nav_names_every_page_once():
    listed = nav_pages()
    written = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(listed) == written


def test_no_page_names_this_machine():
    here = str(PROJECT_ROOT)
    for page in [README, *DOCS.rglob("*.md")]:
        assert here not in page.read_text(), page


def test_no_command_against_the_stack_assumes_its_port():
    # A second terminal does not know which ports keel up was given: it asks (keel url)
    hard_coded = re.compile(r"(127\.0\.0\.1|localhost):\d+")
    written = [p for p in DOCS.rglob("*.md") if not p.is_relative_to(DOCS / "reference")]
    for page in [README, *written]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{page.relative_to(PROJECT_ROOT)}:{number}: {line}"
            assert "KEEL_WEB_PORT:-" not in line, where
            assert "curl" not in line or not hard_coded.search(line), where

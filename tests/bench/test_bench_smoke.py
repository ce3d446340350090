"""The benchmark's one test: ``python -m bench --quick`` runs and writes what it promises.

It checks the plumbing (servers, workers, JSON, Markdown, PNG), never the
figures: numbers on a shared CI host say nothing. It runs in a subprocess
with its own temporary servers, so nothing of the suite's stack is shared.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.bench_runs import run_bench

pytestmark = pytest.mark.timeout(150)


@pytest.mark.slow  # a minute of benchmarking: a release check of the bench tool
def test_quick_bench_writes_json_markdown_and_png(tmp_path: Path) -> None:
    out = run_bench(tmp_path, "bench", "--quick", "--repeat", "1", "--only", "P1,P5", timeout=200)

    [report] = out.glob("*.json")
    body = json.loads(report.read_text())
    assert body["meta"]["quick"] is True and body["meta"]["repeat"] == 1
    assert set(body["figures"]) == {"P1", "P5"}
    for key, figure in body["figures"].items():
        assert figure["error"] is None, (key, figure["error"])
        assert isinstance(figure["met"], bool) and figure["ratio"] > 0
        assert all(len(s["samples"]) == 1 and s["median"] > 0 for s in figure["series"])
    assert [s["label"] for s in body["figures"]["P1"]["series"]][:2] == ["bare Celery", "Keel"]
    # and tracing's cost, measured against a worker that did export spans
    p1 = body["figures"]["P1"]["details"]
    assert p1["traced_ratio"] > 0 and p1["traced_exports"]["requests"] > 0, p1
    png = out / f"{report.stem}.png"
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra is installed
        assert png.read_bytes().startswith(b"\x89PNG")
    assert "| P1 " in (out / "latest.md").read_text()
    assert not list(tmp_path.glob("keel-bench-*")), "the bench left its servers' data behind"

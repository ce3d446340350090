"""``python -m bench --only P7`` measures no-op jobs on 1 and then 2 worker hosts.

Like the bench's smoke test it checks the plumbing — hosts built and removed,
a rate for each setting, the servers' CPU and a named bottleneck — never the
figures themselves: numbers on a shared CI host say nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.netns import PREFIX, ip, unavailable_reason

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# The benchmark's P7 on two hosts, as the quick benchmark's own test: the slow tier.
pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(240)]


def test_bench_prints_throughput_for_one_and_two_worker_hosts(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # The suite's conftest points KEEL_* at its own servers: the bench must start its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["TMPDIR"] = str(tmp_path)
    out = tmp_path / "results"
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--repeat",
            "1",
            "--only",
            "P7",
            "--results-dir",
            str(out),
        ],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed, _ = bench.communicate(timeout=220)
    finally:
        bench.kill()
    assert bench.returncode == 0, printed[-4000:]
    print(printed[-2500:])

    [report] = out.glob("*.json")
    figure = json.loads(report.read_text())["figures"]["P7"]
    assert figure["error"] is None and figure["skipped"] is None, figure
    series = {s["label"]: s for s in figure["series"]}
    assert list(series) == ["1 worker host", "2 worker hosts"]
    assert all(len(s["samples"]) == 1 and s["median"] > 0 for s in series.values())
    assert figure["ratio"] > 0
    for hosts in ("1 worker host", "2 worker hosts"):
        [note] = [n for n in figure["notes"] if n.startswith(f"{hosts}:")]
        assert "servers' CPU postgres" in note and "bottleneck:" in note, note
    assert "| P7 " in (out / "latest.md").read_text()
    # and nothing of its hosts is left: namespaces (named after its pid), files
    assert f"{PREFIX}-{bench.pid}-" not in ip("netns", "list").stdout
    assert not list(tmp_path.glob(f"{PREFIX}-*")), "the bench left its hosts' files behind"

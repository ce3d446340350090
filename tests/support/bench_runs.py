"""A bench command run as its user runs it: a subprocess with its own temporary servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def run_bench(tmp_path: Path, *args: str, timeout: float) -> Path:
    """``python -m <args> --results-dir <tmp>/results``; the results directory. The
    suite's conftest points KEEL_* at its own servers: the bench must start its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["TMPDIR"] = str(tmp_path)
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", *args, "--results-dir", str(out)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out

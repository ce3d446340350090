"""P6: how long ``keel --help`` and ``keel token`` take, beside importing the Celery app.

Each sample is the median wall time of a few fresh processes, the commands
alternating within a repetition so that a busy moment on the host hits all
of them. The Celery app import is what every ``keel`` command paid before the
app became lazy; it is shown for scale, not as a target.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.env import PROJECT_ROOT
from bench.plan import Run
from bench.stats import Figure, Series

TARGET_S = 1.0
CALLS_PER_SAMPLE = 5


def keel_command() -> list[str]:
    """The installed ``keel`` script next to this interpreter, else the same entry point."""
    script = Path(sys.executable).with_name("keel")
    if script.exists():
        return [str(script)]
    found = shutil.which("keel")
    return [found] if found else [sys.executable, "-c", "from keel.cli import main; main()"]


def commands() -> dict[str, list[str]]:
    keel = keel_command()
    return {
        "keel --help": [*keel, "--help"],
        "keel token": [*keel, "token", "--tenant", "bench", "--user", "bench-user"],
        "import the Celery app": [sys.executable, "-c", "import tasks.celery"],
    }


def wall_ms(args: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(args, cwd=PROJECT_ROOT, check=True, capture_output=True, timeout=60)
    return (time.perf_counter() - began) * 1000


def p6_cli(run: Run) -> Figure:
    fig = Figure(
        "P6",
        "CLI start-up (fresh process, wall time)",
        target=f"keel --help and keel token < {TARGET_S:.0f} s on an idle machine",
    )
    todo = commands()
    for args in todo.values():
        wall_ms(args)  # warm the file cache and the bytecode
    series = {label: Series(label, "ms") for label in todo}
    calls = 3 if run.quick else CALLS_PER_SAMPLE
    for _ in range(run.repeat):
        samples: dict[str, list[float]] = {label: [] for label in todo}
        for _ in range(calls):
            for label, args in todo.items():
                samples[label].append(wall_ms(args))
        for label, values in samples.items():
            series[label].samples.append(statistics.median(values))
    fig.series = list(series.values())
    slowest = max(series["keel --help"].median, series["keel token"].median)
    fig.met = slowest < TARGET_S * 1000
    fig.ratio = series["import the Celery app"].median / series["keel token"].median
    fig.ratio_text = "Celery app import / keel token (ms)"
    fig.notes.append(
        f"each sample: median of {calls} fresh processes; the host's load average is in the "
        "header, and on a busy host these are upper bounds"
    )
    return fig

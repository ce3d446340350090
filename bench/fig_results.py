"""P9 (callers waiting on results): ``AsyncResult.get()`` from many threads at once.

A repetition sends N calls of a small task (``add``, ``ms`` of work each) and starts one
thread per call that waits on its ``.get()``, the way a web app's request threads wait for
their jobs. It ends when every thread has its result; each result is checked.

- bare Celery: the Redis result backend (the caller subscribes to the result's channel);
- Keel: the same call on Keel's app; the result is read from the job's record.

Keel's price of reading results from Postgres is the statements the waiting callers issue:
counted exactly in this process (SQLAlchemy's ``before_cursor_execute``), from the first
``.get()`` to the last answer, sends excluded. A reader that polled its record every 0.1 s
would issue about ten per second of waiting per caller; Keel's callers read the record when
the job's end is announced (and every 5 s in one statement per thread, if that news is lost).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from statistics import median
from typing import Any

from bench import bare, jobs
from bench.plan import Run, batch_timeout
from bench.procs import CeleryWorker
from bench.stats import Figure, Series, ratio

WORK_MS = 50  # each task's work: 200 callers wait about 5 s in all (2 processes)
STATEMENTS_TARGET = 3.0  # per waiting caller


def _wait_all(results: list[Any], expected: list[int], timeout: float) -> list[float]:
    """One thread per result, each on ``.get()``; how long each waited (seconds)."""
    answers: dict[int, Any] = {}
    waited: list[float] = []

    def wait(i: int) -> None:
        began = time.monotonic()
        try:
            answers[i] = results[i].get(timeout=timeout)
        except Exception as exc:  # a wrong or missing answer is reported, not raised here
            answers[i] = exc
        waited.append(time.monotonic() - began)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    wrong = [i for i, value in enumerate(expected) if answers.get(i) != value]
    if wrong:
        raise RuntimeError(f"{len(wrong)} of {len(results)} callers got a wrong answer or none")
    return waited


def _batch(task: Any, n: int, count: Callable[[], int] | None) -> dict[str, float]:
    started = time.monotonic()
    results = [task.delay(i, 1, WORK_MS) for i in range(n)]
    before = count() if count is not None else 0
    waited = _wait_all(results, [i + 1 for i in range(n)], batch_timeout(n))
    ended = time.monotonic()
    figures = {
        "seconds": ended - started,
        "results_per_s": n / (ended - started),
        "median_wait_s": median(waited),
    }
    if count is not None:
        figures["statements"] = count() - before
    return figures


def p9_waiting(run: Run) -> Figure:
    from sqlalchemy import event

    from tasks.platform.db import engine

    n = 200 if not run.quick else 50
    conc = run.sizes.worker_concurrency
    fig = Figure(
        "P9",
        f"{n} callers waiting on AsyncResult.get()",
        target=f"≤ {STATEMENTS_TARGET:.0f} Postgres statements per waiting caller",
    )
    statements = {"n": 0}
    counting = threading.Lock()  # 200 threads issue statements at once

    def counted(*_args: Any) -> None:
        with counting:
            statements["n"] += 1

    event.listen(engine(), "before_cursor_execute", counted)
    systems = {
        "bare Celery": (
            lambda: CeleryWorker(run.env, "bare-results", "bench.bare", conc, ["-Q", bare.QUEUE]),
            lambda: _batch(bare.add, n, None),
        ),
        "Keel": (
            lambda: CeleryWorker(run.env, "keel-results", "tasks", conc, ["-I", "bench.jobs"]),
            lambda: _batch(jobs.add, n, lambda: statements["n"]),
        ),
    }
    rates = {name: Series(name, "results/s") for name in systems}
    per_caller = Series("Keel statements per waiting caller", "statements", chart=False)
    runs: list[dict] = []
    try:
        for rep in range(run.repeat):
            for name, (worker, batch) in systems.items():
                run.log(f"P9 rep {rep + 1}/{run.repeat}: {name}, {n} waiting callers")
                with worker():
                    batch()  # warm-up: the worker's pool and the callers' connections
                    result = batch()
                rates[name].samples.append(result["results_per_s"])
                if "statements" in result:
                    per_caller.samples.append(result["statements"] / n)
                runs.append({"system": name, "rep": rep, **result})
                run.log(f"  {name}: {result['seconds']:.2f} s for {n} results")
    finally:
        event.remove(engine(), "before_cursor_execute", counted)
    fig.series = [*rates.values(), per_caller]
    fig.ratio = ratio(rates["Keel"], rates["bare Celery"])
    fig.ratio_text = "Keel / bare Celery (results/s, every caller waiting)"
    fig.met = per_caller.median <= STATEMENTS_TARGET
    fig.details = {"callers": n, "work_ms": WORK_MS, "worker_concurrency": conc, "runs": runs}
    keel_wait = median(r["median_wait_s"] for r in runs if r["system"] == "Keel")
    fig.notes.append(
        f"Postgres statements the waiting callers issued, per caller: median "
        f"{per_caller.median:.2f} (sends excluded; bare Celery issues none, its results are "
        f"in Redis). The median Keel caller waited {keel_wait:.2f} s: a reader polling its "
        f"record every 0.1 s would have issued about {10 * keel_wait:.0f}."
    )
    return fig

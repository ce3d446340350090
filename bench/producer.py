"""P7's producer, run on the client host: ``python -m bench.producer N [WARMUP]``.

It adds WARMUP no-op jobs and waits for them, prints ``ready`` and waits for
a line on stdin (the figure reads the servers' CPU meanwhile), then adds N
jobs from this one thread, as P1 does, and prints one JSON line once every
record says finished: jobs/s from the first add to the last ``finished_on``,
the enqueue rate, and this process's own CPU seconds for the batch. It
deletes the rows it added, so every repetition sees the same table.
"""

from __future__ import annotations

import json
import resource
import sys
import time

from sqlalchemy import text

POLL_S = 0.1
PROGRESS = text(
    "SELECT count(*) FILTER (WHERE state IN ('completed', 'failed')), max(finished_on) "
    "FROM jobs WHERE id = ANY(:ids)"
)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def batch(n: int) -> dict:
    """Add ``n`` no-op jobs, wait until all finished; the figures, then remove the rows."""
    from bench import jobs
    from tasks.jobs import add
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    cpu, started = _cpu_s(), time.time()
    ids = [add(jobs.NOOP, {"i": i}, queue=jobs.QUEUE).job_id for i in range(n)]
    enqueued = time.time() - started
    deadline = time.monotonic() + 60 + n / 10  # at 10 jobs/s something is broken, not slow
    while True:
        with transaction() as session:
            finished, last = session.execute(PROGRESS, {"ids": ids}).one()
        if finished == n:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n - finished} of {n} jobs unfinished")
        time.sleep(POLL_S)
    result = {
        "rate": n / (last.timestamp() - started),
        "enqueue_rate": n / enqueued,
        "seconds": last.timestamp() - started,
        "cpu_s": _cpu_s() - cpu,
    }
    with transaction() as session:
        session.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": ids})
    counts.compact(max_rows=10 * n)
    return result


def main(argv: list[str]) -> int:
    n, warmup = int(argv[0]), int(argv[1]) if len(argv) > 1 else 0
    if warmup:
        batch(warmup)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(batch(n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Work put in flight by one release during a rolling upgrade (``tests/migration``).

The upgrade test runs this file's source with ``python -c`` in a release's
own tree (the previous release from git, or this checkout), so it uses only
what both releases have: ``tasks.jobs.intake``, the report service, the test
job types and Celery's canvas. It prints one JSON line: the ids of what it
added, by kind.
"""

import json
import sys
import uuid

from celery import chord

import tests.support.jobs as test_jobs
from tasks.jobs import JobOptions, Owner, add
from tasks.reports.service import submit

REPORTS = 12
SLEEPS_MS = 4000
CHORD_PARTS = 6
PART_MS = 1200
DELAY_MS = 45_000


def put(label):
    owner = Owner("acme", "upgrade")
    reports = {}
    for n in range(REPORTS):
        report_id = f"{label}-{n}-{uuid.uuid4().hex[:6]}"
        # every fourth fails its first run: its retry waits in the delayed set across the switch
        submitted = submit(owner, report_id, 10 + n, fail_until_attempt=1 if n % 4 == 0 else None)
        reports[submitted.job_id] = submitted.operation_key
    # long runs: still running when the previous release's worker is told to stop
    sleeps = [add("test.sleep", {"ms": SLEEPS_MS}, queue="default").job_id for _ in range(2)]
    delayed = [
        add(
            "test.echo", {"n": n, "by": label}, queue="default", opts=JobOptions(delay=DELAY_MS)
        ).job_id
        for n in range(4)
    ]
    delayed.append(test_jobs.celery_add.apply_async((40, 2), countdown=DELAY_MS / 1000).id)
    parts = [test_jobs.celery_part.s(i, label, ms=PART_MS) for i in range(CHORD_PARTS)]
    body = chord(parts)(test_jobs.celery_collect.s())
    print(
        json.dumps(
            {"reports": reports, "sleeps": sleeps, "delayed": delayed, "chord_body": body.id}
        )
    )


if __name__ == "__main__":
    put(sys.argv[1])

"""The backlog gauges of /metrics, on a queue nobody consumes here (the fast tier has no
worker): the oldest waiting job's age grows, and is read through its index."""

from __future__ import annotations

import time

from sqlalchemy import text

from tasks.jobs import add
from tasks.platform.db import transaction
from tests.support.client import metrics_headers


def gauge(client, name: str, queue: str) -> float | None:
    prefix = f'{name}{{queue="{queue}"}} '
    for line in (
        client.get("/metrics", headers=metrics_headers()).get_data(as_text=True).splitlines()
    ):
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_the_oldest_waiting_age_grows_while_nothing_consumes_the_queue(client):
    assert gauge(client, "keel_oldest_waiting_seconds", "default") is None  # nothing waits
    add("test.echo", {"n": 1}, queue="default")
    first = gauge(client, "keel_oldest_waiting_seconds", "default")
    assert first is not None and 0 <= first < 30
    time.sleep(1.5)
    later = gauge(client, "keel_oldest_waiting_seconds", "default")
    assert later is not None and later >= first + 1.0


def test_a_due_delayed_job_nobody_promotes_is_counted(client):
    job = add("test.echo", {"n": 2}, queue="default", opts=None)
    with transaction() as session:  # as a job parked for a broker that refused it
        session.execute(
            text(
                "UPDATE jobs SET state = 'delayed', run_at = now() - interval '1 minute' "
                "WHERE id = :id"
            ),
            {"id": job.job_id},
        )
    assert gauge(client, "keel_jobs_delayed_due", "default") == 1


def test_the_age_is_read_through_its_partial_index(client):
    """One index probe however long the backlog: with 20,000 waiting jobs of a queue (and
    the table analyzed), the plan reads the partial index, not the queue's rows."""
    with transaction() as session:
        session.execute(
            text(
                "INSERT INTO jobs (id, name, queue, data, opts, state, created_at) "
                "SELECT 'backlog-' || n, 'test.echo', 'metrics-backlog', '{}', '{}', 'waiting', "
                "now() - make_interval(secs => n) FROM generate_series(1, 20000) AS n"
            )
        )
        session.execute(text("ANALYZE jobs"))
    with transaction() as session:
        plan = "\n".join(
            session.scalars(
                text(
                    "EXPLAIN SELECT min(COALESCE(run_at, created_at)) FROM jobs "
                    "WHERE queue = 'metrics-backlog' AND state = 'waiting'"
                )
            )
        )
    assert "ix_jobs_waiting_since" in plan, plan

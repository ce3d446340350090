"""Bulk actions by filter (``/api/v1/bulk-actions``, ``keel jobs bulk``): one audit row,
bounded batches worked by the workers' maintenance, the tenant's jobs only.

The fast tier: a worker in this process (``inline_worker``) runs the jobs and its
maintenance works the batches; the records in the module's Postgres.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from keel.cli import main as keel
from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.intake import pauses
from tasks.jobs.intake.bulk import BulkJob, add_bulk
from tasks.jobs.upkeep import bulk_actions
from tasks.jobs.upkeep.bulk_actions import BulkFilter
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.client import bearer, record, unique
from tests.support.inline import join
from tests.support.jobs import BROKEN_KEY
from tests.support.stack import wait_for
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("inline_worker")
REASON = "the provider is back after the outage"
DAY_MS = 86_400_000


def states_of(job_ids: list[str]) -> dict[str, int]:
    with transaction() as session:
        rows = session.execute(
            text("SELECT state, count(*) AS n FROM jobs WHERE id = ANY(:ids) GROUP BY state"),
            {"ids": job_ids},
        )
        return {row.state: row.n for row in rows}


def bulk_rows(tenant: str) -> list[dict]:
    with transaction() as session:
        rows = session.execute(
            text("SELECT * FROM bulk_actions WHERE tenant_id = :t ORDER BY created_at"),
            {"t": tenant},
        )
        return [dict(row._mapping) for row in rows]


def finished(client, view: dict, headers: dict, timeout: float = 60) -> dict:
    """The bulk action once the workers have done it (read through the API)."""

    def done() -> dict | None:
        now = client.get(view["statusUrl"], headers=headers).get_json()
        return now if now["state"] == "done" else None

    return wait_for(done, timeout=timeout)


def many(name: str, count: int, queue: str, owner: Owner, **opts) -> list[str]:
    jobs = [BulkJob(name, {"i": i}, queue, JobOptions(**opts)) for i in range(count)]
    return [added.job_id for added in add_bulk(jobs, owner=owner)]


def on_queue(action: str, queue: str, tenant: str) -> bulk_actions.Asked:
    """``action`` on every job of ``tenant`` on ``queue``, as its operator ``ops`` asks."""
    return bulk_actions.Asked(
        action, BulkFilter(states=(), queue=queue, tenant_id=tenant), "ops", REASON
    )


def test_a_bulk_retry_runs_the_tenant_s_failed_jobs_of_one_name_again_once(client):
    # Given 500 jobs of one name that failed while their provider was down, a failed job of
    # another name, and the same 5 failures of another tenant
    tenant, other = unique("t"), unique("t")
    ops = bearer(tenant, "ops", ("operator",))
    key = unique("provider")
    redis_client().set(BROKEN_KEY.format(key), 1)
    mine = [
        added.job_id
        for added in add_bulk(
            [BulkJob("test.fixable", {"key": key}, "default") for _ in range(500)],
            owner=Owner(tenant, "alice"),
        )
    ]
    theirs = [
        added.job_id
        for added in add_bulk(
            [BulkJob("test.fixable", {"key": key}, "default") for _ in range(5)],
            owner=Owner(other, "bob"),
        )
    ]
    elsewhere = add("test.always_fails", {}, queue="default", owner=Owner(tenant, "alice")).job_id
    join([*mine, *theirs, elsewhere], timeout=240)  # a tenant runs at most half the slots
    redis_client().delete(BROKEN_KEY.format(key))
    # When its operator counts, then retries, the failed jobs of that name
    asked = {"action": "retry", "filter": {"name": "test.fixable"}, "reason": REASON}
    preview = client.post("/api/v1/bulk-actions", json={**asked, "dryRun": True}, headers=ops)
    assert preview.status_code == 200 and preview.get_json()["matched"] == 500, preview.get_json()
    started = client.post("/api/v1/bulk-actions", json=asked, headers=ops)
    assert started.status_code == 202, started.get_json()
    view = started.get_json()
    assert (view["matched"], view["actor"], view["reason"]) == (500, "ops", REASON), view
    # Then the 500 run again, once each, and complete
    done = finished(client, view, ops)
    assert done["done"] == 500, done
    jobs = join(mine, timeout=240)
    assert {job["state"] for job in jobs.values()} == {"completed"}
    assert {job["attemptsStarted"] for job in jobs.values()} == {1}
    assert {tuple(r["outcome"] for r in job["runs"]) for job in jobs.values()} == {
        ("failed", "manual-retry", "completed")
    }
    # and nothing else was touched; the action is one audit row, with its filter and count
    assert states_of(theirs) == {"failed": 5}
    assert record(elsewhere)["state"] == "failed"
    (row,) = bulk_rows(tenant)
    assert (row["action"], row["actor"], row["matched"], row["done"]) == ("retry", "ops", 500, 500)
    # and each job's retry is audited as a manual retry is, naming the bulk action
    with transaction() as session:
        audits = session.execute(
            text(
                "SELECT count(*) FROM job_retry_audit WHERE job_id = ANY(:ids) "
                "AND retried_by = 'ops' AND ids ->> 'bulkAction' = :bulk"
            ),
            {"ids": mine, "bulk": row["id"]},
        ).scalar_one()
    assert audits == 500
    assert row["filter"] == {"states": ["failed"], "name": "test.fixable"}
    assert bulk_rows(other) == []


def test_a_bulk_cancel_of_ten_thousand_waiting_jobs_cancels_all_none_run_others_untouched(
    client,
):
    # Given 10,000 waiting jobs of a tenant on a queue no worker consumes, and 10 of another
    # tenant's on the same queue
    tenant, other = unique("t"), unique("t")
    ops = bearer(tenant, "ops", ("operator",))
    queue = unique("quiet")
    mine = []
    for _ in range(10):
        mine += many("test.echo", 1000, queue, Owner(tenant, "alice"))
    theirs = many("test.echo", 10, queue, Owner(other, "bob"))
    # When its operator cancels every waiting job of the queue
    asked = {
        "action": "cancel",
        "filter": {"queue": queue, "states": ["waiting"]},
        "reason": REASON,
    }
    started = client.post("/api/v1/bulk-actions", json=asked, headers=ops).get_json()
    assert started["matched"] == 10_000, started
    # Then, batch after batch, all are cancelled and none ran; the other tenant's wait on
    done = finished(client, started, ops, timeout=120)
    assert done["done"] == 10_000, done
    assert states_of(mine) == {"cancelled": 10_000}
    with transaction() as session:
        ran = session.execute(
            text("SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND attempts_started > 0"),
            {"ids": mine},
        ).scalar_one()
    assert ran == 0
    assert states_of(theirs) == {"waiting": 10}


def test_promote_drain_and_clean_act_on_what_they_name(client):
    tenant = unique("t")
    ops = bearer(tenant, "ops", ("operator",))
    owner = Owner(tenant, "alice")
    queue = unique("quiet")
    delayed = many("test.echo", 3, queue, owner, delay=DAY_MS)
    # promote: the delayed jobs wait to run now
    body = {"action": "promote", "filter": {"queue": queue}, "reason": REASON}
    finished(client, client.post("/api/v1/bulk-actions", json=body, headers=ops).get_json(), ops)
    assert states_of(delayed) == {"waiting": 3}
    # drain: the queue's waiting and delayed jobs are cancelled
    later = many("test.echo", 2, queue, owner, delay=DAY_MS)
    body = {"action": "drain", "filter": {"queue": queue}, "reason": REASON}
    view = client.post("/api/v1/bulk-actions", json=body, headers=ops).get_json()
    assert finished(client, view, ops)["done"] == 5
    assert states_of(delayed + later) == {"cancelled": 5}
    # clean: finished records before a moment are deleted (failed ones archived)
    ran = add("test.echo", {}, queue="default", owner=owner).job_id
    failed = add("test.always_fails", {}, queue="default", owner=owner).job_id
    join([ran, failed])
    before = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    body = {"action": "clean", "filter": {"finishedBefore": before}, "reason": REASON}
    view = client.post("/api/v1/bulk-actions", json=body, headers=ops).get_json()
    assert finished(client, view, ops)["done"] == 7
    assert states_of(delayed + later + [ran, failed]) == {}
    with transaction() as session:
        archived = session.execute(
            text("SELECT count(*) FROM failed_jobs_archive WHERE id = :id"), {"id": failed}
        ).scalar_one()
    assert archived == 1


def test_an_action_left_mid_way_is_taken_up_by_the_workers_and_done_once():
    # Given an action whose first batch one process did, then stopped (died)
    tenant = unique("t")
    queue = unique("quiet")
    jobs = many("test.echo", 1200, queue, Owner(tenant, "alice"))
    asked = on_queue("cancel", queue, tenant)
    row = bulk_actions.start(asked)
    bulk_actions.work(row.id, batches=1)
    # and jobs added after it was asked
    newer = many("test.echo", 5, queue, Owner(tenant, "alice"))
    # Then the workers' maintenance goes on with it until every job is cancelled, once,
    # and the jobs added after it are not drawn in
    wait_for(lambda: bulk_actions.view(row.id, tenant).state == "done", timeout=60)
    after = bulk_actions.view(row.id, tenant)
    assert (after.matched, after.done) == (1200, 1200)
    assert states_of(jobs) == {"cancelled": 1200}
    assert states_of(newer) == {"waiting": 5}


def test_each_job_is_visited_once_even_one_that_comes_back_into_the_filter():
    # Given 1,200 delayed jobs, and an action promoting them that did its first batch
    tenant = unique("t")
    queue = unique("quiet")
    jobs = many("test.echo", 1200, queue, Owner(tenant, "alice"), delay=DAY_MS)
    asked = on_queue("promote", queue, tenant)
    row = bulk_actions.start(asked)
    while bulk_actions.view(row.id, tenant).done == 0:
        bulk_actions.work(row.id, batches=1)
    # When the jobs it promoted are parked again (as a broker away or a limit parks them)
    with transaction() as session:
        parked = session.execute(
            text(
                "UPDATE jobs SET state = 'delayed', run_at = now() + interval '1 day' "
                "WHERE id = ANY(:ids) AND state = 'waiting' RETURNING id"
            ),
            {"ids": jobs},
        ).all()
    # Then the action goes on past them: each job promoted once, the count the jobs it did
    wait_for(lambda: bulk_actions.view(row.id, tenant).state == "done", timeout=60)
    after = bulk_actions.view(row.id, tenant)
    assert (after.matched, after.done) == (1200, 1200)
    assert states_of(jobs) == {"delayed": len(parked), "waiting": 1200 - len(parked)}


def test_a_batch_waits_out_a_row_another_transaction_holds_and_misses_none():
    # Given waiting jobs, one of them held by another transaction for 4 s (a batch waits
    # at most 2 s for a row)
    tenant = unique("t")
    queue = unique("quiet")
    jobs = many("test.echo", 5, queue, Owner(tenant, "alice"))
    asked = on_queue("cancel", queue, tenant)
    with transaction() as holding:
        holding.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": jobs[2]})
        row = bulk_actions.start(asked)
        # Then the action is not done while the row is held: its batch fails and says why
        wait_for(lambda: bulk_actions.view(row.id, tenant).last_error, timeout=30)
        held = bulk_actions.view(row.id, tenant)
        assert held.state == "running" and "lock" in held.last_error.lower(), held.last_error
    # and once it is let go, every job is cancelled, none missed
    wait_for(lambda: bulk_actions.view(row.id, tenant).state == "done", timeout=30)
    assert bulk_actions.view(row.id, tenant).done == 5
    assert states_of(jobs) == {"cancelled": 5}


def test_each_bulk_endpoint_keeps_to_the_operator_s_tenant(client):
    tenant, other = unique("t"), unique("t")
    ops, their_ops = bearer(tenant, "ops", ("operator",)), bearer(other, "ops", ("operator",))
    alice = bearer(tenant, "alice")
    queue = unique("quiet")
    mine = many("test.echo", 3, queue, Owner(tenant, "alice"))
    body = {"action": "cancel", "filter": {"queue": queue}, "reason": REASON}
    # A user who is not an operator may not
    assert client.post("/api/v1/bulk-actions", json=body, headers=alice).status_code == 403
    # Another tenant's operator matches none of these jobs
    theirs = client.post("/api/v1/bulk-actions", json={**body, "dryRun": True}, headers=their_ops)
    assert theirs.get_json()["matched"] == 0
    view = client.post("/api/v1/bulk-actions", json=body, headers=ops).get_json()
    # and cannot read this tenant's action, nor can a user of it
    assert client.get(view["statusUrl"], headers=their_ops).status_code == 404
    assert client.get(view["statusUrl"], headers=alice).status_code == 403
    finished(client, view, ops)
    assert states_of(mine) == {"cancelled": 3}


@pytest.mark.parametrize(
    "body",
    [
        {"action": "obliterate", "filter": {"queue": "default"}},  # the system's only
        {"action": "explode"},
        {"action": "retry", "filter": {"states": ["waiting"]}},  # not what retry acts on
        {"action": "drain"},  # needs a queue
        {"action": "cancel", "filter": {"tenantId": "someone-else"}},
        {"action": "cancel", "filter": {"createdAfter": "2026-01-01T00:00:00"}},  # no zone
        {"action": "cancel", "filter": {"queue": "a\u0000b"}},
        {"action": "cancel", "reason": "short"},
    ],
)
def test_a_bad_bulk_request_is_a_400_and_records_nothing(client, body):
    tenant = unique("t")
    ops = bearer(tenant, "ops", ("operator",))
    answer = client.post("/api/v1/bulk-actions", json={"reason": REASON, **body}, headers=ops)
    assert answer.status_code == 400, answer.get_json()
    assert set(answer.get_json()) == {"error", "message", "details"}
    assert bulk_rows(tenant) == []


def test_the_cli_acts_on_one_tenant_s_jobs_and_reports_its_progress_to_the_end():
    tenant, other = unique("t"), unique("t")
    queue = unique("quiet")
    mine = many("test.echo", 700, queue, Owner(tenant, "alice"))
    theirs = many("test.echo", 3, queue, Owner(other, "bob"))
    cli = ["jobs", "bulk", "cancel", "--queue", queue, "--tenant", tenant]
    done = CliRunner().invoke(keel, [*cli, "--reason", REASON, "--by", "root", "--yes"])
    assert done.exit_code == 0, done.output
    assert "cancel: 700 jobs match" in done.stderr and "700 of 700 done" in done.stderr
    view = json.loads(done.stdout.splitlines()[-1])
    assert (view["state"], view["matched"], view["done"], view["tenantId"]) == (
        "done",
        700,
        700,
        tenant,
    )
    assert states_of(mine) == {"cancelled": 700}
    assert states_of(theirs) == {"waiting": 3}


def test_the_cli_shows_the_count_asks_and_obliterates_only_a_paused_queue():
    queue = unique("quiet")
    jobs = many("test.echo", 4, queue, Owner(unique("t"), "alice"))
    cli = ["jobs", "bulk", "obliterate", "--queue", queue, "--reason", REASON, "--by", "root"]
    # Not paused: refused, saying what to do
    refused = CliRunner().invoke(keel, [*cli, "--yes"])
    assert refused.exit_code == 1 and f"keel queues pause {queue}" in refused.output
    pauses.pause(queue, by="root")
    try:
        # Paused: the count, a question, and told no, nothing happens
        declined = CliRunner().invoke(keel, cli, input="n\n")
        assert "obliterate: 4 jobs match" in declined.output and declined.exit_code == 1
        assert states_of(jobs) == {"waiting": 4}
        # told yes, every record of the queue goes
        done = CliRunner().invoke(keel, [*cli, "--yes"])
    finally:
        pauses.resume(queue, by="root")
    assert done.exit_code == 0, done.output
    view = json.loads(done.stdout.splitlines()[-1])
    assert (view["state"], view["matched"], view["done"]) == ("done", 4, 4)
    assert states_of(jobs) == {}


def test_the_dashboard_counts_the_jobs_then_starts_the_action_once_confirmed(app):
    tenant = unique("t")
    queue = unique("quiet")
    jobs = many("test.echo", 3, queue, Owner(tenant, "alice"), delay=DAY_MS)
    operator = signed_in(app, tenant, "olga", ("operator",))
    listing = operator.get(f"/ui/jobs?queue={queue}", headers=PAGE).get_data(as_text=True)
    assert 'id="bulk-form"' in listing
    token = csrf_token(operator)
    form = {"csrf_token": token, "queue": queue, "action": "cancel", "reason": REASON}
    # The count comes first, and nothing is done yet
    confirm = operator.post("/ui/bulk/confirm", data=form, headers=PAGE)
    page = confirm.get_data(as_text=True)
    assert confirm.status_code == 200 and re.search(r'id="bulk-count"><b>3</b>', page), page
    assert states_of(jobs) == {"delayed": 3}
    # Confirmed, the action starts and its page follows it to the end
    started = operator.post("/ui/bulk", data=form, headers=PAGE)
    assert started.status_code == 303, started.get_data(as_text=True)
    progress = started.headers["Location"]
    wait_for(lambda: states_of(jobs) == {"cancelled": 3}, timeout=30)
    shown = operator.get(progress, headers=PAGE).get_data(as_text=True)
    assert re.search(r"<b>3</b> of <b>3</b> jobs done", shown), shown
    # Another tenant's operator gets no page of it
    theirs = signed_in(app, unique("t"), "olga", ("operator",))
    assert theirs.get(progress, headers=PAGE).status_code == 404
    # A user who is not an operator gets neither page
    alice = signed_in(app, tenant, "alice")
    hers = {**form, "csrf_token": csrf_token(alice)}
    assert alice.post("/ui/bulk/confirm", data=hers, headers=PAGE).status_code == 403
    assert alice.post("/ui/bulk", data=hers, headers=PAGE).status_code == 403
    assert alice.get(progress, headers=PAGE).status_code == 403

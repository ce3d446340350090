"""Aborting a running job (``DELETE`` of an active job): it ends ``cancelled``, never run again.

The fast tier: a Celery worker in this process (``inline_worker``, threads), the records in
the module's Postgres. A run that stops by itself (``is_aborted()``), a run whose end is
refused, the end statements' guards, the stalled check, the audit, the owner scope and the
explicit retry of a cancelled job. Stopping a run that does not stop (the grace period, a
killed pool process) needs real worker processes: ``test_abort_termination``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest
from celery.concurrency.prefork import TaskPool
from celery.worker import state as worker_state
from sqlalchemy import text

from tasks.jobs import JobOptions, add
from tasks.jobs.end import abort, finish, revocations, stalls
from tasks.jobs.end.cancel import cancel
from tasks.jobs.model.errors import Defer, JobConflict
from tasks.jobs.model.options import Deduplication
from tasks.jobs.model.owner import Owner
from tasks.jobs.observe import events
from tasks.jobs.run import termination
from tasks.jobs.store import runs
from tasks.platform.db import transaction
from tests.support.client import bearer, claimed_job, record, unique, wait_state
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("inline_worker")

# A prefork pool, for what it is (its processes can be killed), not started.
PREFORK = TaskPool.__new__(TaskPool)
# What a cooperative handler needs to see an abort and stop: it checks every 0.1 s.
STOPS_WITHIN_S = 10


def audit_rows(job_id: str) -> list[tuple[str, str, dict]]:
    with transaction() as session:
        rows = session.execute(
            text("SELECT action, actor, details FROM job_actions WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        )
        return [(row.action, row.actor, row.details) for row in rows]


@pytest.mark.parametrize("name", ["test.cooperative", "test.celery_cooperative"])
def test_deleting_an_active_job_aborts_its_run_which_stops_and_the_job_ends_cancelled(client, name):
    # Given a job of alice's that runs until it sees an abort (job.is_aborted() for a
    # handler, self.is_aborted() for a bound Celery task)
    tenant = unique("t")
    alice = bearer(tenant, "alice")
    job_id = client.post("/api/v1/jobs", json={"name": name}, headers=alice).get_json()["jobId"]
    wait_state(job_id, "active", timeout=30)
    # When she deletes it, saying why
    deleted = client.delete(f"/api/v1/jobs/{job_id}?reason=sent+by+mistake", headers=alice)
    # Then the answer is 202: still active, its abort asked for
    assert deleted.status_code == 202, deleted.get_json()
    body = deleted.get_json()
    assert body["state"] == "active" and body["abortRequestedAt"], body
    told = [e for e in events.read([body["queue"]]) if e["jobId"] == job_id]
    assert ("aborting", "alice") in [(e["event"], e.get("by")) for e in told], told
    # and the handler stops by itself: the job ends cancelled, its run too, with no result
    job = wait_state(job_id, "cancelled", "completed", "failed", timeout=STOPS_WITHIN_S)
    assert job["state"] == "cancelled", job
    assert job["result"] is None and job["finishedOn"], job
    assert [(run["outcome"], run["reason"]) for run in job["runs"]] == [
        ("cancelled", abort.ABORTED)
    ], job
    logged = client.get(f"/api/v1/jobs/{job_id}/logs", headers=alice).get_json()
    assert [line["message"] for line in logged["logs"]] == ["aborted: stopping cleanly"]
    # and the audit says who asked, and why, once
    assert audit_rows(job_id) == [
        ("abort", "alice", {"state": "active", "attempt": 1, "reason": "sent by mistake"})
    ]
    # and deleting it again answers it as it is
    again = client.delete(f"/api/v1/jobs/{job_id}", headers=alice)
    assert again.status_code == 200 and again.get_json()["state"] == "cancelled"
    assert len(audit_rows(job_id)) == 1


def test_a_run_that_ignores_the_abort_is_not_recorded_as_it_ends_the_job_is_cancelled():
    # Given a run that sleeps 2 s and never checks for an abort (the grace period, 10 s,
    # is longer: nothing stops it)
    job_id = add("test.sleep", {"ms": 2000}, queue="default").job_id
    wait_state(job_id, "active", timeout=30)
    # When it is aborted, twice
    first = cancel(job_id, None, actor="ops", reason="wrong customer")
    second = cancel(job_id, None, actor="ops", reason="wrong customer")
    assert first.aborting and second.aborting
    assert first.job.state == second.job.state == "active"
    # Then the result it returns is refused: the job ends cancelled, audited once
    job = wait_state(job_id, "cancelled", "completed", timeout=30)
    assert job["state"] == "cancelled" and job["result"] is None, job
    assert job["runs"][-1]["outcome"] == "cancelled", job
    assert [row[:2] for row in audit_rows(job_id)] == [("abort", "ops")]


def test_a_finished_job_cannot_be_aborted():
    job_id = add("test.echo", {}, queue="default").job_id
    wait_state(job_id, "completed", timeout=30)
    with pytest.raises(JobConflict, match="a completed job cannot be cancelled"):
        cancel(job_id, None)
    assert audit_rows(job_id) == []


def test_another_tenant_or_user_cannot_abort_a_job_an_operator_of_its_tenant_can(client):
    tenant = unique("t")
    alice, bob = bearer(tenant, "alice"), bearer(tenant, "bob")
    mallory = bearer(unique("t"), "alice", ("operator",))
    ops = bearer(tenant, "ops", ("operator",))
    body = {"name": "test.cooperative", "data": {"seconds": 30}}
    job_id = client.post("/api/v1/jobs", json=body, headers=alice).get_json()["jobId"]
    wait_state(job_id, "active", timeout=30)
    # Another tenant's operator and another user of the tenant get the answer for no job
    for stranger in (mallory, bob):
        refused = client.delete(f"/api/v1/jobs/{job_id}", headers=stranger)
        assert refused.status_code == 404 and refused.get_json()["error"] == "not_found"
    assert record(job_id)["abortRequestedAt"] is None and audit_rows(job_id) == []
    # and the tenant's operator aborts it
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=ops).status_code == 202
    assert wait_state(job_id, "cancelled", timeout=STOPS_WITHIN_S)["state"] == "cancelled"
    assert [row[:2] for row in audit_rows(job_id)] == [("abort", "ops")]


def test_a_bad_reason_is_a_400_and_aborts_nothing(client):
    tenant = unique("t")
    alice = bearer(tenant, "alice")
    body = {"name": "test.cooperative", "data": {"seconds": 30}}
    job_id = client.post("/api/v1/jobs", json=body, headers=alice).get_json()["jobId"]
    wait_state(job_id, "active", timeout=30)
    for query in ("reason=" + "x" * 2001, "reason=", "reason=%00", "reason=a%0Ab", "why=because"):
        refused = client.delete(f"/api/v1/jobs/{job_id}?{query}", headers=alice)
        assert refused.status_code == 400, (query, refused.get_json())
        assert refused.get_json()["error"] == "validation_failed"
    assert record(job_id)["abortRequestedAt"] is None
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=alice).status_code == 202
    wait_state(job_id, "cancelled", timeout=STOPS_WITHIN_S)


def test_a_cancelled_job_is_retried_only_when_the_operator_asks_for_it_explicitly(client):
    tenant = unique("t")
    alice, ops = bearer(tenant, "alice"), bearer(tenant, "ops", ("operator",))
    body = {"name": "test.cooperative", "data": {"seconds": 3}}
    job_id = client.post("/api/v1/jobs", json=body, headers=alice).get_json()["jobId"]
    wait_state(job_id, "active", timeout=30)
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=alice).status_code == 202
    wait_state(job_id, "cancelled", timeout=STOPS_WITHIN_S)
    # A retry as for a failed job is refused, saying how to ask
    reason = {"reason": "the customer asked for it after all"}
    refused = client.post(f"/api/v1/jobs/{job_id}/retry", json=reason, headers=ops)
    assert refused.status_code == 400, refused.get_json()
    assert "retryCancelled" in refused.get_json()["message"]
    assert record(job_id)["state"] == "cancelled"
    # asked explicitly, the job runs again (its abort forgotten) and completes
    asked = {**reason, "retryCancelled": True}
    accepted = client.post(f"/api/v1/jobs/{job_id}/retry", json=asked, headers=ops)
    assert accepted.status_code == 202, accepted.get_json()
    job = wait_state(job_id, "completed", "cancelled", "failed", timeout=30)
    assert job["state"] == "completed" and job["result"] == {"stopped": False}, job
    assert job["abortRequestedAt"] is None, job


def test_a_job_cancelled_by_celery_s_revoke_is_not_retried_the_workers_would_discard_it(client):
    # Given a waiting job of a tenant, revoked the Celery way (its message discarded)
    tenant = unique("t")
    ops = bearer(tenant, "ops", ("operator",))
    owner = Owner(tenant, "alice")
    job_id = add("test.echo", {}, queue=unique("quiet"), owner=owner).job_id
    assert revocations.revoked_message(job_id, terminated=False) == [job_id]
    # When an operator asks to retry it, cancelled jobs included
    asked = {"reason": "the customer asked for it after all", "retryCancelled": True}
    refused = client.post(f"/api/v1/jobs/{job_id}/retry", json=asked, headers=ops)
    # Then it is refused, saying why, and the job stays cancelled
    assert refused.status_code == 409, refused.get_json()
    assert "revoke" in refused.get_json()["message"]
    assert record(job_id)["state"] == "cancelled"


def test_the_dashboard_offers_abort_on_an_active_job_s_page_and_says_what_it_did(app):
    tenant = unique("t")
    owner = Owner(tenant, "alice")
    job_id = add("test.cooperative", {"seconds": 30}, queue="default", owner=owner).job_id
    wait_state(job_id, "active", timeout=30)
    operator = signed_in(app, tenant, "olga", ("operator",))
    page = operator.get(f"/ui/jobs/{job_id}", headers=PAGE).get_data(as_text=True)
    form = re.search(r'<form[^>]*id="abort-form"[^>]*>', page)
    assert form is not None and "hidden" not in form.group(0), page
    done = operator.post(
        f"/ui/jobs/{job_id}/cancel",
        data={"csrf_token": csrf_token(operator)},
        follow_redirects=True,
    )
    assert "Aborting: the job ends cancelled once its run stops." in done.get_data(as_text=True)
    wait_state(job_id, "cancelled", timeout=STOPS_WITHIN_S)
    assert [row[:2] for row in audit_rows(job_id)] == [("abort", "olga")]


# --- the end statements' guards (no worker runs these jobs: a queue nobody consumes) -------


def test_is_aborted_says_whether_the_run_should_stop():
    claimed = claimed_job()
    assert runs.is_aborted(claimed) is False
    cancel(claimed.id, None)
    assert runs.is_aborted(claimed) is True
    # and a run that is no longer the job's (its token not the record's) is told to stop too
    other = claimed_job()
    assert runs.is_aborted(runs.ClaimedJob(**{**other.__dict__, "token": "not-ours"})) is True


@pytest.mark.parametrize(
    "end",
    [
        lambda claimed: finish.completed(claimed, {"ok": True}),
        lambda claimed: finish.failed(claimed, RuntimeError("boom")),
        lambda claimed: finish.deferred(claimed, Defer(1000)),
    ],
    ids=["completed", "failed-with-attempts-left", "deferred"],
)
def test_every_end_of_an_aborted_run_is_refused_and_the_job_ends_cancelled(end):
    # Given a running job of three attempts, with a deduplication claim, being aborted
    dedup_id = unique("d")
    claimed = claimed_job(attempts=3, deduplication=Deduplication(id=dedup_id))
    cancel(claimed.id, None, actor="ops", reason="stop it")
    # When its run ends, whichever way
    with pytest.raises(abort.Aborted):
        end(claimed)
    # Then the job is cancelled, not completed, retried nor delayed; its run says why
    job = record(claimed.id)
    assert (job["state"], job["result"], job["attemptsMade"]) == ("cancelled", None, 0), job
    assert job["runs"][-1]["outcome"] == "cancelled", job
    assert job["runs"][-1]["reason"] == abort.ABORTED, job
    # and its deduplication claim is freed: the same operation can be added again
    rule = JobOptions(deduplication=Deduplication(id=dedup_id))
    again = add("test.echo", {}, queue=job["queue"], opts=rule)
    assert again.job_id != claimed.id and again.created


def test_a_run_being_aborted_whose_worker_died_is_cancelled_by_the_stalled_check():
    # Given a run being aborted whose lock ran out (its worker died), and a stalled job beside
    aborted, stalled = claimed_job(), claimed_job()
    cancel(aborted.id, None)
    with transaction() as session:
        session.execute(
            text("UPDATE jobs SET locked_until = now() - interval '1 s' WHERE id = ANY(:ids)"),
            {"ids": [aborted.id, stalled.id]},
        )
    # Then no delivery takes the aborted one over
    with transaction() as session:
        assert runs.claim(session, aborted.id, "token", 30, "other@host") is None
    # and the stalled check cancels it, where it requeues the other
    # (the worker's maintenance pass may hold the rows at this moment: either sweep ends them)
    stalls.requeue_stalled_once()
    assert wait_state(aborted.id, "cancelled", "waiting", "failed")["state"] == "cancelled"
    assert wait_state(stalled.id, "cancelled", "waiting", "failed")["state"] == "waiting"
    seen = [
        (entry["event"], entry.get("by"))
        for entry in events.read([aborted.queue])
        if entry["jobId"] == aborted.id
    ]
    assert seen[-1] == ("cancelled", "abort"), seen


# --- the grace period's stop, against a stand-in process (its own worker's state faked) ----


@dataclass(eq=False)
class HeldRequest:
    """What the stop reads of a request Celery holds (``worker_state.active_requests``)."""

    id: str
    worker_pid: int


@pytest.fixture
def stand_in():
    """A process that stands for a pool process running an aborted job's run."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def overdue_run(pid: int) -> runs.ClaimedJob:
    """A run of ``tester@host``'s pool process ``pid`` whose abort was asked an hour ago,
    held by this worker (in ``active_requests``, as Celery keeps it)."""
    claimed = claimed_job()
    with transaction() as session:
        session.execute(
            text(
                "UPDATE jobs SET runs = jsonb_set(runs, '{0,pid}', to_jsonb(CAST(:pid AS int))) "
                "WHERE id = :id"
            ),
            {"id": claimed.id, "pid": pid},
        )
    cancel(claimed.id, None)
    with transaction() as session:
        session.execute(
            text("UPDATE jobs SET abort_requested_at = now() - interval '1 hour' WHERE id = :id"),
            {"id": claimed.id},
        )
    return claimed


def test_an_overdue_aborted_run_s_process_is_killed_then_its_job_cancelled(stand_in):
    claimed = overdue_run(stand_in.pid)
    request = HeldRequest(claimed.id, stand_in.pid)
    worker_state.active_requests.add(request)
    try:
        ended = termination.stop_overdue("tester@host", PREFORK)
    finally:
        worker_state.active_requests.discard(request)
    assert ended == [claimed.id]
    assert stand_in.wait(timeout=10) == -signal.SIGKILL
    job = record(claimed.id)
    assert job["state"] == "cancelled", job
    assert "stopped after the 10 s grace period" in job["runs"][-1]["reason"], job
    # and the worker knows the process it will hear of as lost was this stop's, once
    assert termination.was_stopped(claimed.id, stand_in.pid) is True
    assert termination.was_stopped(claimed.id, stand_in.pid) is False


def test_a_run_that_ended_just_before_its_stop_is_left_alone_and_its_process_not_killed(
    stand_in,
):
    # Given an overdue aborted run, found by the check, that ends by itself just then (its
    # end recorded: the job cancelled), its pool process going on to other work
    claimed = overdue_run(stand_in.pid)
    assert abort.end_run(claimed)
    request = HeldRequest(claimed.id, stand_in.pid)
    worker_state.active_requests.add(request)
    try:
        # When the stop comes for it
        stopped = termination._stop(claimed.id, stand_in.pid, "tester@host", PREFORK, 10)
    finally:
        worker_state.active_requests.discard(request)
    # Then nothing is killed: the process runs on
    assert stopped is False
    assert stand_in.poll() is None
    assert termination.was_stopped(claimed.id, stand_in.pid) is False

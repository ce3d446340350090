"""The dashboard's pages with a test client: the API's rules and messages, empty states, errors.

(What only a browser shows — live updates, dialogs, layout — is in ``tests/browser``.)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from tasks.jobs.end.cancel import cancel_many
from tasks.jobs.intake import pauses
from tasks.jobs.model.models import CANCELLABLE_STATES, JobRecord
from tasks.platform.config import reload_settings
from tasks.platform.db import transaction
from tests.support.client import bearer, unique, wait_state
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("pages")
ALICE = bearer(tenant=TENANT, user="alice")
BOB = bearer(tenant=TENANT, user="bob")
OPERATOR = ("operator",)


def flashes(response) -> list[str]:
    """The flashed messages (a job page's failure reason is styled as one, with no role)."""
    return re.findall(r'class="flash \w+" role="\w+">([^<]*)<', response.get_data(as_text=True))


def delayed_job(client, headers=ALICE) -> str:
    run_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    response = client.post(
        "/api/v1/reports/scheduled",
        json={"reportId": unique(), "rows": 3, "runAt": run_at},
        headers=headers,
    )
    return response.get_json()["jobId"]


def test_an_unfinished_campaign_is_shown_with_resume_and_no_verdict_yet(app, client):
    campaign = client.post(
        "/api/v1/campaigns",
        json={"name": "pages", "category": "c", "template": "hi", "recipientCount": 3},
        headers=ALICE,
    ).get_json()["campaignId"]
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    page = operator.get(f"/ui/campaigns/{campaign}", headers=PAGE).get_data(as_text=True)
    assert "Checked once the campaign has finished" in page and 'id="resume-form"' in page
    listed = operator.get("/ui/campaigns", headers=PAGE).get_data(as_text=True)
    assert f'data-campaign-id="{campaign}"' in listed
    # A user without the role sees her own campaign, without the operator's Resume
    alice = signed_in(app, TENANT, "alice")
    assert 'id="resume-form"' not in alice.get(f"/ui/campaigns/{campaign}").get_data(as_text=True)
    # (No provider runs in this module: the campaign's jobs are cancelled, not left to a worker.)
    with transaction() as session:
        ids = session.scalars(
            select(JobRecord.id).where(JobRecord.data["campaignId"].astext == campaign)
        ).all()
    cancel_many(ids, CANCELLABLE_STATES, by="test")


def test_empty_pages_say_what_to_do(app):
    newcomer = signed_in(app, unique("empty"), "nina", OPERATOR)
    for path, hint in (
        ("/ui/jobs", "No jobs yet"),
        ("/ui/schedulers", "No job schedulers"),
        ("/ui/campaigns", "No campaigns yet"),
    ):
        page = newcomer.get(path, headers=PAGE)
        assert page.status_code == 200 and hint in page.get_data(as_text=True), path


def test_a_user_sees_her_own_jobs_and_an_operator_the_tenants(app, client):
    mine, bobs = delayed_job(client, ALICE), delayed_job(client, BOB)
    alice = signed_in(app, TENANT, "alice")
    listed = alice.get("/ui/jobs", headers=PAGE).get_data(as_text=True)
    assert mine in listed and bobs not in listed
    assert alice.get(f"/ui/jobs/{bobs}", headers=PAGE).status_code == 404
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    both = operator.get("/ui/jobs", headers=PAGE).get_data(as_text=True)
    assert mine in both and bobs in both


def test_operator_pages_tell_other_users_they_are_for_operators(app):
    alice = signed_in(app, TENANT, "alice")
    for path in ("/ui/schedulers", "/ui/queues", "/ui/new-scheduler"):
        page = alice.get(path, headers=PAGE)
        assert page.status_code == 403 and "for operators" in page.get_data(as_text=True)


@pytest.mark.parametrize(
    "query,field",
    [("state=bogus", "state"), ("cursor=!!", "cursor"), ("limit=0", "limit"), ("x=1", "x")],
)
def test_bad_filters_are_a_400_page_naming_the_field(app, query, field):
    alice = signed_in(app, TENANT, "alice")
    page = alice.get(f"/ui/jobs?{query}", headers=PAGE)
    assert page.status_code == 400 and "query string is invalid" in page.get_data(as_text=True)
    fetched = alice.get(f"/ui/jobs/table?{query}")
    assert fetched.status_code == 400 and fetched.get_json()["details"][0]["field"] == field


@pytest.mark.parametrize(
    "form,message",
    [
        ({"rule": "pattern", "pattern": "not a cron"}, "pattern"),
        ({"rule": "every", "every": "soon"}, "every must be a whole number"),
        ({"rule": "every", "every": "5"}, "every"),
        ({"rule": "pattern", "pattern": "0 0 1 1 *", "data": "{nope"}, "template.data"),
        ({"rule": "pattern", "pattern": "0 0 1 1 *", "name": "reports.cleanup"}, "system"),
        ({"rule": "pattern", "pattern": "0 0 1 1 *", "data": '{"rows": -1}'}, "rows"),
    ],
)
def test_a_refused_scheduler_form_comes_back_with_the_apis_reason(app, form, message):
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    body = {
        "csrf_token": csrf_token(operator),
        "id": unique("s"),
        "name": "report.generate",
        "data": '{"reportId": "r", "rows": 5}',
        "opts": "{}",
        **form,
    }
    page = operator.post("/ui/schedulers", data=body, headers=PAGE)
    text = page.get_data(as_text=True)
    assert page.status_code == 400 and 'id="form-error"' in text and message in text
    assert body["id"] in text  # what was typed is kept
    assert operator.get(f"/ui/schedulers/{body['id']}", headers=PAGE).status_code == 404


def test_actions_refused_by_the_api_show_its_message(app, client, inline_worker):
    submitted = client.post("/api/v1/jobs", json={"name": "test.echo"}, headers=ALICE)
    job_id = submitted.get_json()["jobId"]
    wait_state(job_id, "completed")
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    token = csrf_token(operator)
    cancel = operator.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token}, follow_redirects=True
    )
    assert "a completed job cannot be cancelled" in " ".join(flashes(cancel))
    reason = "checking the rules of the dashboard"
    retry = operator.post(
        f"/ui/jobs/{job_id}/retry",
        data={"csrf_token": token, "reason": reason},
        follow_redirects=True,
    )
    assert "only failed jobs can be retried: completed" in " ".join(flashes(retry))
    state = operator.get(f"/ui/jobs/{job_id}/state").get_json()
    assert state["state"] == "completed" and state["attemptsStarted"] == 1


def test_the_queues_page_counts_the_tenants_jobs_and_links_to_flower(app, client, monkeypatch):
    # Flower's link comes from the configured public URL (never the request's Host)
    monkeypatch.setenv("KEEL_PUBLIC_URL", "http://keel.test:8000")
    reload_settings()
    tenant = unique("queues")
    delayed_job(client, bearer(tenant=tenant, user="alice"))
    operator = signed_in(app, tenant, "olga", OPERATOR)
    try:
        page = operator.get("/ui/queues", headers=PAGE)
    finally:
        monkeypatch.delenv("KEEL_PUBLIC_URL")
        reload_settings()
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and 'href="http://keel.test:5555"' in text
    reports = text[text.index('data-queue="reports"') :]
    assert re.search(r'data-state="delayed">delayed <b>1</b>', reports)


def test_only_operators_see_the_flower_link(app, client, monkeypatch):
    # Flower is a system-wide admin tool (every tenant's tasks): its link is for operators
    monkeypatch.setenv("KEEL_FLOWER_URL", "http://flower.keel.test:5555/")
    reload_settings()
    tenant = unique("flower")
    job = delayed_job(client, bearer(tenant=tenant, user="alice"))
    alice = signed_in(app, tenant, "alice")
    operator = signed_in(app, tenant, "olga", OPERATOR)
    try:
        pages = {
            who: {
                path: signed.get(path, headers=PAGE)
                for path in ("/ui/jobs", f"/ui/jobs/{job}", "/ui/campaigns")
            }
            for who, signed in (("alice", alice), ("olga", operator))
        }
    finally:
        monkeypatch.delenv("KEEL_FLOWER_URL")
        reload_settings()
    for who, answers in pages.items():
        for path, page in answers.items():
            text = page.get_data(as_text=True)
            assert page.status_code == 200, (who, path)
            linked = 'href="http://flower.keel.test:5555/"' in text
            assert linked == (who == "olga"), (who, path)
            assert ("Flower" in text) == (who == "olga"), (who, path)


def test_an_operator_pauses_and_resumes_the_tenants_jobs_on_a_queue_from_the_queues_page(app):
    tenant = unique("pausing")
    operator = signed_in(app, tenant, "olga", OPERATOR)
    page = operator.get("/ui/queues", headers=PAGE).get_data(as_text=True)
    reports = page[page.index('data-queue="reports"') :].split("</section>")[0]
    assert "/ui/queues/reports/pause" in reports and "paused" not in reports
    # When she pauses it (the form, with its CSRF token)
    token = csrf_token(operator)
    done = operator.post(
        "/ui/queues/reports/pause", data={"csrf_token": token}, follow_redirects=True
    )
    # Then the page says so, offers Resume, and the pause is her tenant's alone
    text = done.get_data(as_text=True)
    assert flashes(done) == ["Paused: your jobs on reports wait until you resume it."]
    reports = text[text.index('data-queue="reports"') :].split("</section>")[0]
    assert 'data-paused="tenant"' in reports and "/ui/queues/reports/resume" in reports
    assert [(p.queue, p.tenant_id) for p in pauses.paused(tenant)] == [("reports", tenant)]
    assert pauses.paused(unique("other")) == []
    # When she resumes it
    done = operator.post(
        "/ui/queues/reports/resume", data={"csrf_token": token}, follow_redirects=True
    )
    assert flashes(done) == ["Resumed: your jobs on reports run again."]
    assert pauses.paused(tenant) == []
    # and a form without its token is refused
    refused = operator.post("/ui/queues/reports/pause", data={})
    assert refused.status_code == 400 and pauses.paused(tenant) == []


def test_a_tenants_own_pause_can_be_resumed_while_the_system_pauses_the_queue_too(app):
    tenant = unique("pausing")
    assert pauses.pause("reports", tenant, by="olga")
    assert pauses.pause("reports", by="cli:root")
    try:
        operator = signed_in(app, tenant, "olga", OPERATOR)
        page = operator.get("/ui/queues", headers=PAGE).get_data(as_text=True)
        reports = page[page.index('data-queue="reports"') :].split("</section>")[0]
        # Both pauses show: the system's note, and her own pause's Resume
        assert 'data-paused="all"' in reports and "Paused for every tenant" in reports
        assert "/ui/queues/reports/resume" in reports and "/ui/queues/reports/pause" not in reports
        done = operator.post(
            "/ui/queues/reports/resume",
            data={"csrf_token": csrf_token(operator)},
            follow_redirects=True,
        )
        assert flashes(done) == ["Resumed: your jobs on reports run again."]
        assert [(p.queue, p.tenant_id) for p in pauses.paused(tenant)] == [("reports", "")]
    finally:
        pauses.resume("reports", by="cli:root")
        pauses.resume("reports", tenant, by="olga")


def test_the_job_page_shows_the_newest_lines_of_its_log(app, client):
    from tasks.jobs.run import job_log
    from web.ui.jobs import JOB_PAGE_LOG_LINES

    job_id = delayed_job(client)
    alice = signed_in(app, TENANT, "alice")
    empty = alice.get(f"/ui/jobs/{job_id}", headers=PAGE).get_data(as_text=True)
    assert "No lines:" in empty and 'id="job-log"' not in empty
    # Given more lines than the page shows, one with markup in it
    for n in range(JOB_PAGE_LOG_LINES + 5):
        job_log.write(job_id, 1, f"line {n}")
    assert job_log.write(job_id, 2, "<script>alert(1)</script>") == JOB_PAGE_LOG_LINES + 6
    page = alice.get(f"/ui/jobs/{job_id}", headers=PAGE).get_data(as_text=True)
    table = page[page.index('id="job-log"') :].split("</table>")[0]
    # Then the newest are shown, numbered, the markup as text
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', table)]
    total = JOB_PAGE_LOG_LINES + 6
    assert seqs == list(range(total - JOB_PAGE_LOG_LINES + 1, total + 1))
    assert f"The newest {JOB_PAGE_LOG_LINES} of {total} lines" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in table and "<script>alert" not in table


def test_the_owner_runs_a_delayed_job_now_from_its_page(app, client):
    job_id = delayed_job(client)
    alice = signed_in(app, TENANT, "alice")
    page = alice.get(f"/ui/jobs/{job_id}", headers=PAGE).get_data(as_text=True)
    form = page[page.index('id="promote-form"') :].split("</form>")[0]
    assert "hidden" not in form.split(">")[0] and "Run now" in form
    done = alice.post(
        f"/ui/jobs/{job_id}/promote",
        data={"csrf_token": csrf_token(alice)},
        follow_redirects=True,
    )
    assert flashes(done) == ["Promoted: the job waits to run now."]
    # (a worker of this session may take it at once)
    state = alice.get(f"/ui/jobs/{job_id}/state").get_json()["state"]
    assert state in ("waiting", "active", "completed")
    # Promoted already: a second post says why
    again = alice.post(
        f"/ui/jobs/{job_id}/promote",
        data={"csrf_token": csrf_token(alice)},
        follow_redirects=True,
    )
    [refusal] = flashes(again)
    assert re.fullmatch(r"an? \w+ job cannot be promoted: only a delayed one can", refusal)
    # Another user of the tenant cannot
    bob = signed_in(app, TENANT, "bob")
    assert (
        bob.post(f"/ui/jobs/{job_id}/promote", data={"csrf_token": csrf_token(bob)}).status_code
        == 404
    )

"""The platform role (``keel ui-link --platform``): every tenant's jobs, queues and key limit
overrides, read only but for the limits (``test_platform_limit_forms``), each view audited;
a tenant's session — whatever roles it names — and a tenant's token see no more than before.
(In Chromium: ``tests/browser/test_platform_role.py``.)"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from keel.cli import main
from tasks.jobs.observe import platform_views
from tasks.jobs.run import live_key_limits
from tests.support.client import bearer, unique
from tests.support.ui import PAGE, csrf_token, signed_in, signed_in_platform

pytestmark = pytest.mark.usefixtures("stack")
ACME, GLOBEX = unique("acme"), unique("globex")
OPERATOR = ("operator",)
REASON = "partner incident: hold their burst for the night"


def delayed_job(client, tenant: str, user: str = "alice", queue_rows: int = 3) -> str:
    run_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    response = client.post(
        "/api/v1/reports/scheduled",
        json={"reportId": unique(), "rows": queue_rows, "runAt": run_at},
        headers=bearer(tenant=tenant, user=user),
    )
    assert response.status_code == 202, response.get_json()
    return response.get_json()["jobId"]


def page(session, path: str, status: int = 200) -> str:
    response = session.get(path, headers=PAGE)
    assert response.status_code == status, (path, response.status_code)
    return response.get_data(as_text=True)


def test_ui_link_platform_prints_a_link_to_every_tenants_jobs(app, client):
    acme_job, globex_job = delayed_job(client, ACME), delayed_job(client, GLOBEX, "bob")
    # Given the link `ui-link --platform` prints
    result = CliRunner().invoke(
        main, ["ui-link", "--platform", "--user", "root", "--url", "http://ui.test:8000/"]
    )
    assert result.exit_code == 0, result.output
    path = result.output.strip().removeprefix("http://ui.test:8000")
    browser = app.test_client()
    assert browser.get(path).status_code == 303
    # When it opens the jobs page, it lists both tenants' jobs, each with its tenant
    listed = page(browser, "/ui/jobs")
    assert acme_job in listed and globex_job in listed
    assert "<th>Tenant</th>" in listed and 'id="platform-badge"' in listed
    for tenant, job_id in ((ACME, acme_job), (GLOBEX, globex_job)):
        row = listed[listed.index(f'data-job-id="{job_id}"') :].split("</tr>")[0]
        assert f">{tenant}</a>" in row
    # And the tenant filter narrows it to one tenant
    only_acme = page(browser, f"/ui/jobs?tenant={ACME}")
    assert acme_job in only_acme and globex_job not in only_acme
    table = browser.get(f"/ui/jobs/table?tenant={GLOBEX}").get_data(as_text=True)
    assert globex_job in table and acme_job not in table
    # And nothing on the page acts
    assert 'id="add-job"' not in listed and 'id="bulk-form"' not in listed


@pytest.mark.parametrize(
    "extra", [["--tenant", "acme"], ["--role", "operator"], ["--tenant", "a", "--role", "operator"]]
)
def test_ui_link_platform_refuses_a_tenant_or_a_role_in_one_line(extra):
    result = CliRunner().invoke(main, ["ui-link", "--platform", "--user", "root", *extra])
    assert result.exit_code != 0
    assert result.output.strip().count("\n") == 0, result.output
    assert "without --tenant or --role" in result.output


def test_a_platform_session_reads_any_job_and_offers_no_action(app, client):
    job_id = delayed_job(client, GLOBEX, "bob")
    root = signed_in_platform(app, unique("root"))
    shown = page(root, f"/ui/jobs/{job_id}")
    assert f'data-field="tenantId">{GLOBEX}<' in shown
    assert 'id="actions"' not in shown and 'id="cancel-form"' not in shown
    assert root.get(f"/ui/jobs/{job_id}/state").get_json()["state"] == "delayed"
    # A form sent anyway is refused, and the job is as it was
    cancel = root.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf_token": csrf_token(root)}, headers=PAGE
    )
    assert cancel.status_code == 403 and "acts on none" in cancel.get_data(as_text=True)
    assert root.get(f"/ui/jobs/{job_id}/state").get_json()["state"] == "delayed"
    assert page(root, "/ui/jobs/no-such-job", 404)


def test_every_view_of_a_platform_session_is_audited(app, client):
    job_id = delayed_job(client, ACME)
    user = unique("root")
    root = signed_in_platform(app, user)
    before = datetime.now(UTC) - timedelta(seconds=5)
    page(root, f"/ui/jobs?tenant={ACME}&state=delayed")
    page(root, f"/ui/jobs/{job_id}")
    page(root, "/ui/key-limits")
    page(root, "/ui/schedulers", 403)  # refused before anything is read: nothing to keep
    # Then each is a row with the user, the view, the path and its query, and the time
    rows = platform_views.newest(user)
    assert [(r.view, r.path) for r in reversed(rows)] == [
        ("ui.jobs", f"/ui/jobs?tenant={ACME}&state=delayed"),
        ("ui.job", f"/ui/jobs/{job_id}"),
        ("ui.key_limits_page", "/ui/key-limits"),
    ]
    assert all(datetime.fromisoformat(r.recorded_at or "") >= before for r in rows)
    # And `audit views` prints them, newest first, as JSON lines
    result = CliRunner().invoke(main, ["audit", "views", "--user", user, "--limit", "2"])
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in result.output.splitlines()]
    assert [p["view"] for p in printed] == ["ui.key_limits_page", "ui.job"]
    assert {p["actor"] for p in printed} == {user}
    # A tenant operator's views are not platform views
    page(signed_in(app, ACME, "olga", OPERATOR), "/ui/jobs")
    assert platform_views.newest("olga", 5) == []


def test_the_queues_page_counts_every_tenants_jobs_together(app, client):
    root = signed_in_platform(app, unique("root"))

    def delayed_on_reports(session) -> int:
        text = page(session, "/ui/queues")
        card = text[text.index('data-queue="reports"') :].split("</section>")[0]
        return int(re.search(r'data-state="delayed">delayed <b>(\d+)</b>', card).group(1))

    before = delayed_on_reports(root)
    delayed_job(client, ACME), delayed_job(client, GLOBEX)
    assert delayed_on_reports(root) >= before + 2  # (other modules' jobs may come and go)
    text = page(root, "/ui/queues")
    assert 'id="every-tenant-note"' in text and "pause-form" not in text
    # A tenant's operator counts its own tenant's only
    assert delayed_on_reports(signed_in(app, GLOBEX, "olga", OPERATOR)) >= 1
    mine = page(signed_in(app, GLOBEX, "olga", OPERATOR), "/ui/queues")
    assert 'id="every-tenant-note"' not in mine


@pytest.fixture
def override():
    tenant = unique("partner")
    change = live_key_limits.set_override(
        "test.keyed", tenant, "vip-*", {"max_running": 2}, "cli:ops-anna", REASON
    )
    yield change
    live_key_limits.clear_override("test.keyed", tenant, "vip-*", "cli:ops-anna", REASON)


def test_the_key_limits_page_shows_each_override_with_who_when_and_why(app, override):
    root = signed_in_platform(app, unique("root"))
    text = page(root, "/ui/key-limits")
    card = text[text.index('data-job-type="test.keyed"') :].split("</section>")[0]
    row = card[card.index(f'data-tenant="{override.tenant}"') :].split("</tr>")[0]
    assert 'data-key="vip-*"' in row and "2 at once" in row
    assert "cli:ops-anna" in row and REASON in row and "<time datetime=" in row
    # Its one form is the row's Clear (changes: tests/ui/test_platform_limit_forms.py)
    assert re.findall(r'<form [^>]*class="([^"]+)"', card) == ["inline clear-key-limit"]
    assert override.tenant in page(root, "/ui/key-limits").split('id="key-limit-changes"')[1]


def test_a_tenant_operator_sees_only_its_tenant_and_no_override(app, client, override):
    acme_job, globex_job = delayed_job(client, ACME), delayed_job(client, GLOBEX)
    olga = signed_in(app, ACME, "olga", OPERATOR)
    listed = page(olga, "/ui/jobs")
    assert acme_job in listed and globex_job not in listed and GLOBEX not in listed
    assert "<th>Tenant</th>" not in listed
    assert page(olga, f"/ui/jobs/{globex_job}", 404)
    # A tenant filter is not one of a tenant's: refused, not obeyed
    assert "tenant" in page(olga, f"/ui/jobs?tenant={GLOBEX}", 400)
    # And no page of a tenant's names an override, its tenant or why
    refused = page(olga, "/ui/key-limits", 403)
    assert "platform role" in refused
    for path in ("/ui/jobs", "/ui/queues", "/ui/key-limits"):
        text = olga.get(path, headers=PAGE).get_data(as_text=True)
        assert override.tenant not in text and REASON not in text and "cli:ops-anna" not in text


def test_a_token_or_a_session_naming_the_platform_role_gets_nothing_more(app, client):
    acme_job, globex_job = delayed_job(client, ACME), delayed_job(client, GLOBEX)
    claims = bearer(tenant=ACME, user="mallory", roles=("operator", "platform"))
    # The API: its tenant's jobs, and the system scope refused
    listed = client.get("/api/v1/jobs?limit=100", headers=claims).get_json()["jobs"]
    ids = {job["jobId"] for job in listed}
    assert acme_job in ids and globex_job not in ids
    assert client.get(f"/api/v1/jobs/{globex_job}", headers=claims).status_code == 404
    assert client.get("/api/v1/system/key-limits", headers=claims).status_code == 403
    # The dashboard: a session whose roles name platform is its tenant's operator's
    mallory = signed_in(app, ACME, "mallory", ("operator", "platform"))
    text = page(mallory, "/ui/jobs")
    assert acme_job in text and globex_job not in text and 'id="platform-badge"' not in text
    assert page(mallory, f"/ui/jobs/{globex_job}", 404)
    assert page(mallory, "/ui/key-limits", 403)
    assert platform_views.newest("mallory", 5) == []


def test_ui_signout_platform_ends_a_platform_users_sessions(app):
    user = unique("root")
    root = signed_in_platform(app, user)
    page(root, "/ui/jobs")
    result = CliRunner().invoke(main, ["ui-signout", "--platform", "--user", user])
    assert result.exit_code == 0, result.output
    assert f"ended 1 dashboard session of platform user {user}" in result.output
    assert root.get("/ui/jobs", headers=PAGE).status_code == 401
    both = CliRunner().invoke(main, ["ui-signout", "--platform", "--tenant", ACME, "--user", user])
    assert both.exit_code != 0 and "--platform" in both.output

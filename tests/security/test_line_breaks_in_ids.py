"""An id ending in a line break is refused wherever an id is read: API, dashboard, CLI, job layer.

``re.match(r"^...$", "nightly\\n")`` matches: ``$`` also matches before a final newline.
A scheduler saved from the dashboard's form as ``nightly\\n`` (the form skipped the path
check) fired, held a quota slot, and neither the API nor the dashboard could read, change
or remove it (their paths refuse control characters: 400); only the CLI could.

Every id field is fed a trailing LF, CR, NUL, LINE SEPARATOR (U+2028), PARAGRAPH SEPARATOR
(U+2029) and NEL (U+0085) — every character ``str.splitlines()`` breaks a line at is a
control character or one of the two separators — and must refuse it: 400 from the API
(401 for a token's ids: an invalid token), a refused form or page from the dashboard, a
one-line error exit from ``keel``, a refusal from the job layer. The API's path ids are
enumerated from the served OpenAPI document, the dashboard's from its URL map, so an id
added later is covered without editing this file.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from click.testing import CliRunner

from keel.cli import main as keel
from tasks.celery import app as celery_app
from tasks.jobs.calls.loading import load_job_modules
from tasks.jobs.model.errors import InvalidId
from tasks.jobs.schedule import beat_entries, schedulers
from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope
from tests.security.conftest import documented_operations
from tests.support.client import bearer, metrics_headers, token, unique
from tests.support.keel_up import KEEL
from tests.support.ui import csrf_token, signed_in
from web.ui.session import issue_link

pytestmark = pytest.mark.usefixtures("stack")
BREAKS = {
    "LF": "\n",
    "CR": "\r",
    "NUL": "\x00",
    "LINE SEPARATOR": "\u2028",
    "PARAGRAPH SEPARATOR": "\u2029",
    "NEL": "\x85",
}
TENANT = unique("breaks")
OPERATOR = bearer(tenant=TENANT, user="olga", roles=("operator",))
PAGE = {"Accept": "text/html"}
TEMPLATE = {"name": "report.generate", "data": {"reportId": "r", "rows": 5}}


@pytest.fixture(autouse=True)
def no_leftover_schedulers(drop_schedulers_of):
    drop_schedulers_of.append(TENANT)
    yield
    for record in schedulers.list_all(Scope()):  # what the system-scope cases may have made
        if record.id.startswith("nightly"):
            schedulers.remove(Scope(), record.id)


def held_ids(tenant: str = TENANT) -> set[str]:
    return {record.id for record in schedulers.list_all(Scope(tenant))}


def assert_400(response, field: str | None = None) -> dict:
    assert response.status_code == 400, response.get_data(as_text=True)[:2000]
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}, body
    if field is not None:
        assert field in [d.get("field") for d in body["details"]], body
    return body


# --- the API: every documented path id ------------------------------------------------------

PATH_IDS = [(op, name) for op in documented_operations() for name in op.path_params]


@pytest.mark.parametrize("op,name", PATH_IDS, ids=[f"{op.label} {n}" for op, n in PATH_IDS])
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_path_id_ending_in_a_line_break_is_a_400_before_any_lookup(client, op, name, brk):
    url = op.path
    for param in op.path_params:
        url = url.replace(f"{{{param}}}", quote("ok" + brk if param == name else "ok", safe=""))
    # a system-wide operation takes the metrics token only (a tenant's is 403 before anything)
    headers = metrics_headers() if op.path.startswith("/api/v1/system/") else OPERATOR
    response = client.open(url, method=op.method.upper(), headers=headers)
    body = assert_400(response, name)
    assert body["details"][0]["type"] == "path_parameter"


def test_the_path_ids_are_enumerated():
    names = {name for _, name in PATH_IDS}
    assert {"job_id", "scheduler_id", "campaign_id", "bulk_id", "queue"} <= names, names


# --- the API: ids in tokens, bodies and query strings ---------------------------------------


@pytest.mark.parametrize("claim", ["tenant", "user"])
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_token_whose_tenant_or_user_ends_in_a_line_break_is_refused(client, claim, brk):
    ids = {"tenant": TENANT, "user": "olga"}
    ids[claim] += brk
    headers = {"Authorization": f"Bearer {token(ids['tenant'], ids['user'], ('operator',))}"}
    response = client.get("/api/v1/jobs", headers=headers)
    # An invalid token (the contract: 401), never a tenant or user of that name
    assert response.status_code == 401, response.get_data(as_text=True)
    assert "tenant and sub must be ids" in response.get_json()["message"]


def _in_an_hour() -> str:
    return (datetime.now(UTC) + timedelta(hours=1)).isoformat()


BODY_IDS: list[tuple[str, str, str, Callable[[str], dict], str, str | None]] = [
    # (what, method, url, the body holding the id, a valid id, the field the 400 names)
    (
        "reportId",
        "POST",
        "/api/v1/reports",
        lambda v: {"reportId": v, "rows": 1},
        "quarterly",
        "reportId",
    ),
    (
        "a scheduled report's reportId",
        "POST",
        "/api/v1/reports/scheduled",
        lambda v: {"reportId": v, "rows": 1, "runAt": _in_an_hour()},
        "quarterly",
        "reportId",
    ),
    (
        "a scheduler's queue",
        "PUT",
        "/api/v1/schedulers/{fresh}",
        lambda v: {"every": 60000, "template": TEMPLATE, "queue": v},
        "reports",
        "queue",
    ),
    (
        "a scheduler template's job name",
        "PUT",
        "/api/v1/schedulers/{fresh}",
        lambda v: {"every": 60000, "template": {**TEMPLATE, "name": v}},
        "report.generate",
        None,
    ),
    (
        "a bulk action's queue",
        "POST",
        "/api/v1/bulk-actions",
        lambda v: {"action": "cancel", "filter": {"queue": v}, "reason": "a line break test"},
        "reports",
        "filter.queue",
    ),
    (
        "a bulk action's job name",
        "POST",
        "/api/v1/bulk-actions",
        lambda v: {"action": "cancel", "filter": {"name": v}, "reason": "a line break test"},
        "report.generate",
        "filter.name",
    ),
    (
        "a submitted job's name",
        "POST",
        "/api/v1/jobs",
        lambda v: {"name": v},
        "test.echo",
        None,
    ),
]


@pytest.mark.parametrize(
    "method,url,body,valid,field", [c[1:] for c in BODY_IDS], ids=[c[0] for c in BODY_IDS]
)
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_body_id_ending_in_a_line_break_is_a_400(client, method, url, body, valid, field, brk):
    fresh = unique("s")
    response = client.open(
        url.format(fresh=fresh), method=method, json=body(valid + brk), headers=OPERATOR
    )
    assert_400(response, field)
    assert held_ids() == set()


@pytest.mark.parametrize("field,value", [("queue", "reports"), ("name", "report.generate")])
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_query_id_ending_in_a_line_break_is_a_400(client, field, value, brk):
    response = client.get(f"/api/v1/jobs?{urlencode({field: value + brk})}", headers=OPERATOR)
    assert_400(response, field)


# --- the dashboard ---------------------------------------------------------------------------


def operator_page(app):
    return signed_in(app, TENANT, "olga", ("operator",))


@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_the_scheduler_form_refuses_an_id_ending_in_a_line_break(app, brk):
    # Given an operator's scheduler form whose id ends in a line break (the reported case)
    page = operator_page(app)
    form = {
        "csrf_token": csrf_token(page),
        "id": "nightly" + brk,
        "rule": "every",
        "every": "60000",
        "tz": "UTC",
        "name": "report.generate",
        "data": '{"reportId": "r", "rows": 5}',
        "opts": "{}",
    }
    response = page.post("/ui/schedulers", data=form, headers=PAGE)
    # Then the form comes back refused, and no scheduler was made
    text = response.get_data(as_text=True)
    assert response.status_code == 400, text[-2000:]
    assert 'id="form-error"' in text
    assert held_ids() == set()


def test_the_scheduler_form_still_saves_a_plain_id(app):
    page = operator_page(app)
    form = {
        "csrf_token": csrf_token(page),
        "id": "nightly",
        "rule": "every",
        "every": "60000",
        "tz": "UTC",
        "name": "report.generate",
        "data": '{"reportId": "r", "rows": 5}',
        "opts": "{}",
    }
    response = page.post("/ui/schedulers", data=form, headers=PAGE)
    assert response.status_code == 303, response.get_data(as_text=True)[-2000:]
    assert held_ids() == {"nightly"}


def dashboard_path_ids(app) -> list[tuple[str, str, str]]:
    """(rule, method, id name) of every dashboard page or action that takes an id."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("ui.") or rule.endpoint == "ui.static":
            continue
        if rule.endpoint in ("ui.login", "ui.confirm_login"):
            continue  # a sign-in link's token, not an id: below
        for name in sorted(rule.arguments):
            method = "GET" if "GET" in (rule.methods or ()) else "POST"
            found.append((rule.rule, method, name))
    return found


@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_every_dashboard_path_id_ending_in_a_line_break_is_a_400_page(app, brk):
    page = operator_page(app)
    csrf = csrf_token(page)
    routes = dashboard_path_ids(app)
    assert {name for _, _, name in routes} >= {"job_id", "scheduler_id", "campaign_id", "bulk_id"}
    for rule, method, name in routes:
        url = rule.replace(f"<{name}>", quote("ok" + brk, safe=""))
        data = {"csrf_token": csrf} if method == "POST" else None
        response = page.open(url, method=method, data=data, headers=PAGE)
        assert response.status_code == 400, (url, response.status_code)


@pytest.mark.parametrize("field,value", [("queue", "reports"), ("name", "report.generate")])
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_the_dashboards_job_filter_and_bulk_form_refuse_an_id_ending_in_a_line_break(
    app, field, value, brk
):
    page = operator_page(app)
    listed = page.get(f"/ui/jobs?{urlencode({field: value + brk})}", headers=PAGE)
    assert listed.status_code == 400, listed.get_data(as_text=True)[-2000:]
    form = {
        "csrf_token": csrf_token(page),
        "action": "cancel",
        "reason": "a line break test",
        field: value + brk,
    }
    confirmed = page.post("/ui/bulk/confirm", data=form, headers=PAGE)
    assert confirmed.status_code == 400, confirmed.get_data(as_text=True)[-2000:]


@pytest.mark.parametrize("claim", ["tenant", "user"])
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_sign_in_link_for_an_id_ending_in_a_line_break_signs_no_one_in(app, claim, brk):
    ids = {"tenant": TENANT, "user": "olga"}
    ids[claim] += brk
    link = issue_link(app.config["SECRET_KEY"], ids["tenant"], ids["user"], ["operator"], 60)
    browser = app.test_client()
    response = browser.get(f"/ui/login/{link}", headers=PAGE)
    assert response.status_code == 401, response.status_code
    assert browser.get("/ui/jobs", headers=PAGE).status_code == 401


# --- the keel command ------------------------------------------------------------------------

UPSERT = ("--every", "60000", "--name", "report.generate", "--data", '{"reportId": "r", "rows": 5}')
CLEANUP = ("--every", "60000", "--name", "reports.cleanup", "--data", '{"keepDays": 30}')
REASON = ("--reason", "a line break test", "--by", "olga")
# (what, argv with {v} for the id: a valid one followed by the break)
CLI_IDS: list[tuple[str, tuple[str, ...]]] = [
    ("token --tenant", ("token", "--tenant", "{v}", "--user", "olga")),
    ("token --user", ("token", "--tenant", "acme", "--user", "{v}")),
    ("ui-link --tenant", ("ui-link", "--tenant", "{v}", "--user", "olga")),
    ("ui-link --user", ("ui-link", "--tenant", "acme", "--user", "{v}")),
    ("ui-signout --tenant", ("ui-signout", "--tenant", "{v}", "--user", "olga")),
    ("ui-signout --user", ("ui-signout", "--tenant", "acme", "--user", "{v}")),
    ("schedulers upsert ID (system)", ("schedulers", "upsert", "{v}", *CLEANUP)),
    (
        "schedulers upsert ID (a tenant's)",
        ("schedulers", "upsert", "{v}", "--tenant", TENANT, "--user", "olga", *UPSERT),
    ),
    (
        "schedulers upsert --tenant",
        ("schedulers", "upsert", "nightly", "--tenant", "{v}", "--user", "olga", *UPSERT),
    ),
    (
        "schedulers upsert --user",
        ("schedulers", "upsert", "nightly", "--tenant", TENANT, "--user", "{v}", *UPSERT),
    ),
    ("schedulers upsert --queue", ("schedulers", "upsert", "nightly", "--queue", "{v}", *CLEANUP)),
    ("schedulers remove ID", ("schedulers", "remove", "{v}")),
    ("schedulers remove --tenant", ("schedulers", "remove", "nightly", "--tenant", "{v}")),
    ("schedulers list --tenant", ("schedulers", "list", "--tenant", "{v}")),
    ("jobs list --tenant", ("jobs", "list", "--tenant", "{v}")),
    ("jobs list --queue", ("jobs", "list", "--queue", "{v}")),
    ("jobs list --name", ("jobs", "list", "--name", "{v}")),
    ("jobs list --cursor", ("jobs", "list", "--cursor", "{v}")),
    ("jobs show ID", ("jobs", "show", "{v}")),
    ("jobs cancel ID", ("jobs", "cancel", "{v}")),
    ("jobs retry ID", ("jobs", "retry", "{v}", *REASON)),
    ("jobs bulk --tenant", ("jobs", "bulk", "cancel", "--tenant", "{v}", "--yes", *REASON)),
    ("jobs bulk --queue", ("jobs", "bulk", "cancel", "--queue", "{v}", "--yes", *REASON)),
    ("jobs bulk --name", ("jobs", "bulk", "cancel", "--name", "{v}", "--yes", *REASON)),
    ("jobs republish --queue", ("jobs", "republish", "--queue", "{v}")),
    ("queues pause QUEUE", ("queues", "pause", "{v}")),
    ("queues pause --tenant", ("queues", "pause", "reports", "--tenant", "{v}")),
    ("queues resume QUEUE", ("queues", "resume", "{v}")),
    ("queues resume --tenant", ("queues", "resume", "reports", "--tenant", "{v}")),
    ("campaign verify ID", ("campaign", "verify", "{v}")),
    ("events --queue", ("events", "--queue", "{v}")),
    ("deadletters list --queue", ("deadletters", "list", "--queue", "{v}")),
    ("deadletters drop ID", ("deadletters", "drop", "{v}")),
    ("deadletters drop --queue", ("deadletters", "drop", "--all", "--queue", "{v}")),
]
# A valid value of the id, by the option before it (else a scheduler's, job's, ... id)
VALID = {"--tenant": TENANT, "--user": "olga", "--queue": "reports", "--name": "report.generate"}
QUEUE_ARGUMENT = {("queues", "pause"), ("queues", "resume")}


def _typed(args: tuple[str, ...], brk: str) -> list[str]:
    where = args.index("{v}")
    valid = "reports" if args[:2] in QUEUE_ARGUMENT else VALID.get(args[where - 1], "nightly")
    return [valid + brk if arg == "{v}" else arg for arg in args]


def assert_one_line_error(result) -> None:
    shown = f"exit {result.exit_code}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert isinstance(result.exception, SystemExit), (result.exception, shown)
    assert result.exit_code not in (0, None), shown
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, shown  # splitlines() breaks at every break fed here
    assert "Traceback" not in result.stderr, shown
    assert result.stdout == "", shown


@pytest.mark.parametrize("args", [c[1] for c in CLI_IDS], ids=[c[0] for c in CLI_IDS])
@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_cli_id_ending_in_a_line_break_is_a_one_line_error(args, brk):
    result = CliRunner().invoke(keel, _typed(args, brk))
    assert_one_line_error(result)
    assert held_ids() == set() and held_ids("") & {"nightly" + brk} == set()


def test_the_cli_still_removes_a_scheduler_an_earlier_release_let_in():
    # Given a tenant's scheduler whose id ends in a newline, as the dashboard's form made them
    # (written as that release wrote it: the job layer refuses such an id now)
    from tasks.jobs.model.models import JobSchedulerRecord
    from tasks.platform.db import transaction

    with transaction() as session:
        session.add(
            JobSchedulerRecord(
                tenant_id=TENANT,
                id="nightly\n",
                queue="reports",
                spec={"every": 60000, "template": TEMPLATE},
                iteration_count=0,
            )
        )
    # When the CLI removes it by its id
    result = CliRunner().invoke(keel, ["schedulers", "remove", "nightly\n", "--tenant", TENANT])
    # Then it is gone (the way to mend one)
    assert result.exit_code == 0, result.output
    assert held_ids() == set()


def keel_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``keel ARGS`` as a user runs it, on the suite's servers."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(cwd / "runtime")}
    return subprocess.run(
        [KEEL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ("schedulers", "upsert", "nightly\n", "--tenant", TENANT, "--user", "olga", *UPSERT),
        ("schedulers", "upsert", "nightly\n", *CLEANUP),
        ("token", "--tenant", "acme\n", "--user", "olga"),
        ("jobs", "list", "--tenant", "acme\n"),
    ],
    ids=["a tenant's scheduler", "a system scheduler", "token", "jobs list"],
)
def test_a_real_keel_refuses_an_id_ending_in_a_newline_in_one_line(args, tmp_path):
    # (NUL cannot be given at all: an argument of a program ends at its first NUL)
    result = keel_process(*args, cwd=tmp_path)
    assert result.returncode != 0, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert held_ids() == set() and "nightly\n" not in {r.id for r in schedulers.list_all()}


# --- the job layer ---------------------------------------------------------------------------

SPEC = SchedulerSpec.model_validate({"every": 60000, "template": TEMPLATE})


@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
@pytest.mark.parametrize("tenant", [TENANT, ""], ids=["a tenant's", "the system's"])
def test_the_job_layer_refuses_a_scheduler_id_ending_in_a_line_break(tenant, brk):
    load_job_modules()
    spec = SPEC
    if not tenant:
        spec = SchedulerSpec.model_validate(
            {"every": 60000, "template": {"name": "reports.cleanup", "data": {"keepDays": 30}}}
        )
    with pytest.raises(InvalidId):
        schedulers.upsert(Scope(tenant, "olga"), "nightly" + brk, spec)
    assert "nightly" + brk not in held_ids(tenant)


def test_the_job_layer_holds_a_tenants_scheduler_ids_to_the_apis_rule():
    load_job_modules()
    for refused in ("-nightly", "night ly", "nightly/2", "x" * 201):
        with pytest.raises(InvalidId):
            schedulers.upsert(Scope(TENANT, "olga"), refused, SPEC)
    schedulers.upsert(Scope(TENANT, "olga"), "nightly.v2:eu_1-a", SPEC)
    assert held_ids() == {"nightly.v2:eu_1-a"}


@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_beat_schedule_entry_named_with_a_line_break_is_refused_and_the_rest_scheduled(brk):
    entries = {
        "tick" + brk: {"task": "test.echo", "schedule": 60.0},
        "tock": {"task": "test.echo", "schedule": 60.0},
    }
    before = celery_app.conf.beat_schedule
    celery_app.conf.beat_schedule = entries
    try:
        synced = beat_entries.sync(celery_app)
        celery_app.conf.beat_schedule = {}
        beat_entries.sync(celery_app)  # the beat: schedulers go again
    finally:
        celery_app.conf.beat_schedule = before
    assert synced.refused == ["tick" + brk]
    assert synced.upserted == ["beat:tock"]

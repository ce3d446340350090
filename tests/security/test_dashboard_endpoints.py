"""The dashboard's endpoints (``/ui``) in the security matrices: BOLA, roles, hostile input.

Pass figures: 0 cross-tenant (or cross-user) reads or writes through a page,
a partial or a form; 403 on every operator endpoint for every non-operator
session; 0 5xx on hostile ids, query strings and forms.

The endpoints are read from the app's URL map (every ``ui.*`` rule), so a page
added later is attacked the day it is added — or fails
``test_every_dashboard_endpoint_is_described`` until it is described here.
Objects are created as in the API's matrix (``test_bola.KINDS``: tenant A's
alice, through the API); intruders hold dashboard sessions made through
one-time links, and send valid CSRF tokens, so a refusal is the ownership or
role check, not the CSRF check.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tasks.jobs.intake import webhooks
from tasks.jobs.run import live_key_limits, live_limits
from tests.security.conftest import record_figure
from tests.security.test_bola import INTRUDERS, KINDS, TENANT_A, TENANT_B
from tests.support.client import unique
from tests.support.ui import PAGE, csrf_token, signed_in, signed_in_platform
from web import create_app
from web.auth import OPERATOR, PLATFORM

pytestmark = pytest.mark.usefixtures("stack")

APP = create_app({"TESTING": True})
# The dashboard's twin of each API operation: the same role must guard both.
API_TWINS: dict[str, tuple[str, str]] = {
    "ui.jobs": ("get", "/api/v1/jobs"),
    "ui.jobs_table": ("get", "/api/v1/jobs"),
    "ui.job": ("get", "/api/v1/jobs/{job_id}"),
    "ui.job_state": ("get", "/api/v1/jobs/{job_id}"),
    "ui.job_events": ("get", "/api/v1/jobs/{job_id}"),
    "ui.retry_job": ("post", "/api/v1/jobs/{job_id}/retry"),
    "ui.cancel_job": ("delete", "/api/v1/jobs/{job_id}"),
    "ui.promote_job": ("post", "/api/v1/jobs/{job_id}/promote"),
    "ui.new_job": ("post", "/api/v1/jobs"),
    "ui.add_job": ("post", "/api/v1/jobs"),
    "ui.schedulers_page": ("get", "/api/v1/schedulers"),
    "ui.new_scheduler": ("put", "/api/v1/schedulers/{scheduler_id}"),
    "ui.scheduler": ("get", "/api/v1/schedulers/{scheduler_id}"),
    "ui.save_scheduler": ("put", "/api/v1/schedulers/{scheduler_id}"),
    "ui.remove_scheduler": ("delete", "/api/v1/schedulers/{scheduler_id}"),
    "ui.pause_scheduler": ("post", "/api/v1/schedulers/{scheduler_id}/pause"),
    "ui.resume_scheduler": ("post", "/api/v1/schedulers/{scheduler_id}/resume"),
    "ui.trigger_scheduler": ("post", "/api/v1/schedulers/{scheduler_id}/trigger"),
    "ui.campaigns_page": ("get", "/api/v1/campaigns/{campaign_id}"),
    "ui.campaign": ("get", "/api/v1/campaigns/{campaign_id}"),
    "ui.resume_campaign": ("post", "/api/v1/campaigns/{campaign_id}/resume"),
    "ui.queues_page": ("get", "/api/v1/reports/queue/health"),
    "ui.pause_queue": ("post", "/api/v1/queues/{queue}/pause"),
    "ui.resume_queue": ("post", "/api/v1/queues/{queue}/resume"),
    "ui.confirm_bulk": ("post", "/api/v1/bulk-actions"),
    "ui.start_bulk": ("post", "/api/v1/bulk-actions"),
    "ui.bulk_page": ("get", "/api/v1/bulk-actions/{bulk_id}"),
    "ui.webhooks_page": ("get", "/api/v1/webhooks"),
    "ui.register_webhook": ("post", "/api/v1/webhooks"),
    "ui.webhook": ("get", "/api/v1/webhooks/{endpoint_id}/deliveries"),
    "ui.remove_webhook": ("delete", "/api/v1/webhooks/{endpoint_id}"),
    "ui.resend_delivery": ("post", "/api/v1/webhooks/deliveries/{delivery_id}/resend"),
    "ui.key_limits_page": ("get", "/api/v1/system/key-limits"),
    "ui.set_queue_limits": ("put", "/api/v1/system/queues/{queue}/limits"),
    "ui.clear_queue_limits": ("delete", "/api/v1/system/queues/{queue}/limits"),
    "ui.set_key_limit": ("put", "/api/v1/system/key-limits/{job_name}"),
    "ui.clear_key_limit": ("delete", "/api/v1/system/key-limits/{job_name}"),
}
# Signing in and out: no object, no role (the sign-in link is its own credential, and the
# identity provider's answer the provider's sign-in's).
SIGN_IN = {
    "ui.home",
    "ui.login",
    "ui.confirm_login",
    "ui.signin",
    "ui.logout",
    "ui.static",
    "ui.oidc_login",
    "ui.oidc_callback",
}
BULK_FORM = {"action": "cancel", "queue": "bola-quiet", "reason": "security matrix: bulk"}
# The limit forms' fields, valid: a tenant's session sending them changes nothing here.
MATRIX_LIMITS = "matrix-limits"
LIMITS_FORM = {"queue": MATRIX_LIMITS, "concurrency": "1", "reason": "security matrix: limits"}
KEY_LIMIT_FORM = {
    "name": "test.keyed",
    "tenant": MATRIX_LIMITS,
    "key": "k",
    "maxRunning": "1",
    "reason": "security matrix: key limits",
}
FORMS: dict[str, dict[str, str]] = {
    "ui.retry_job": {"reason": "security matrix: retry from a page"},
    "ui.confirm_bulk": BULK_FORM,
    "ui.start_bulk": BULK_FORM,
    "ui.save_scheduler": {
        "id": "matrix",
        "rule": "pattern",
        "pattern": "0 0 1 1 *",
        "name": "report.generate",
        "data": '{"reportId": "yearly", "rows": 10}',
        "opts": "{}",
    },
    "ui.set_queue_limits": LIMITS_FORM,
    "ui.clear_queue_limits": LIMITS_FORM,
    "ui.set_key_limit": KEY_LIMIT_FORM,
    "ui.clear_key_limit": KEY_LIMIT_FORM,
}
CSRF = re.compile(r'(name="csrf_token" value=")[^"]+"')
CHECKED: list[str] = []


class Endpoint:
    """One method of one ``ui.*`` rule."""

    def __init__(self, endpoint: str, rule: str, method: str) -> None:
        self.endpoint, self.rule, self.method = endpoint, rule, method
        self.params = re.findall(r"<(?:[^:<>]+:)?([^<>]+)>", rule)

    @property
    def label(self) -> str:
        return f"{self.method} {self.rule}"

    @property
    def role(self) -> str | None:
        return getattr(APP.view_functions[self.endpoint], "required_role", None)

    def url(self, value: str | None = None) -> str:
        url = self.rule
        for param in self.params:
            url = re.sub(rf"<(?:[^:<>]+:)?{param}>", value or unique("id"), url)
        return url


ENDPOINTS = [
    Endpoint(rule.endpoint, rule.rule, method)
    for rule in APP.url_map.iter_rules()
    if rule.endpoint.startswith("ui.")
    for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})
]
GUARDED = [e for e in ENDPOINTS if e.endpoint not in SIGN_IN]


def reach(endpoint: Endpoint) -> str:
    """What a platform session may do there (``web.ui.platform``): refused, reads, only or
    acts."""
    return getattr(APP.view_functions[endpoint.endpoint], "reach", "refused")


# Where a platform session is let in: the pages it reads, its own, the forms that change the
# limits every tenant shares (and signing out).
PLATFORM_ACTS = {
    "ui.set_queue_limits",
    "ui.clear_queue_limits",
    "ui.set_key_limit",
    "ui.clear_key_limit",
}
PLATFORM_READS = {
    "ui.jobs",
    "ui.jobs_table",
    "ui.job",
    "ui.job_state",
    "ui.job_events",
    "ui.queues_page",
    "ui.key_limits_page",
}
WITH_IDS = [e for e in GUARDED if e.params]
WITHOUT_IDS = [e for e in GUARDED if not e.params]


def call(client, endpoint: Endpoint, object_id: str | None = None, form: dict | None = None):
    url = endpoint.url(object_id)
    if endpoint.method == "GET":
        response = client.get(url, headers=PAGE)
    else:
        data = {
            "csrf_token": csrf_token(client),
            **FORMS.get(endpoint.endpoint, {}),
            **(form or {}),
        }
        response = client.post(url, data=data, headers=PAGE)
    if response.mimetype == "text/event-stream":
        response.close()
    return response


def answer(response, object_id: str | None = None) -> tuple[int, str]:
    """Status and body, with the id asked for and the session's CSRF tokens blanked."""
    if response.mimetype == "text/event-stream":
        return response.status_code, "<event stream>"
    text = CSRF.sub(r'\1<csrf>"', response.get_data(as_text=True))
    return response.status_code, text.replace(object_id, "<id>") if object_id else text


@pytest.fixture(scope="module")
def sessions() -> dict[str, Any]:
    return {
        "owner": signed_in(APP, TENANT_A, "alice", (OPERATOR,)),
        "other tenant": signed_in(APP, TENANT_B, "alice", (OPERATOR,)),
        "other user": signed_in(APP, TENANT_A, "bob"),
    }


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    record_figure(
        "dashboard matrix",
        f"{len(ENDPOINTS)} dashboard endpoints; {len(CHECKED)} BOLA/role/hostile checks, "
        "0 cross-tenant reads or writes, 0 5xx",
    )


@pytest.fixture(autouse=True)
def no_leftover_schedulers(drop_schedulers_of):
    drop_schedulers_of.extend([TENANT_A, TENANT_B])


@pytest.fixture(autouse=True)
def no_leftover_webhooks():
    """The matrix makes two webhook endpoints of tenant A's per check (an endpoint, and the
    one of a delivery), and a tenant holds at most ``MAX_ENDPOINTS``: they go after each."""
    yield
    for tenant in (TENANT_A, TENANT_B):
        for endpoint in webhooks.listed(tenant):
            webhooks.remove(tenant, endpoint.id)


def test_every_dashboard_endpoint_is_described():
    """A new page must say which API operation it stands for (and so which role guards it)."""
    assert {e.endpoint for e in GUARDED} == set(API_TWINS)
    assert {p for e in WITH_IDS for p in e.params} <= set(KINDS)


def test_the_dashboard_and_the_api_require_the_same_roles():
    from tests.security.conftest import documented_operations

    roles = {(op.method, op.path): op.operator_only for op in documented_operations()}
    for endpoint in GUARDED:
        twin = API_TWINS[endpoint.endpoint]
        assert (endpoint.role == OPERATOR) == roles[twin], f"{endpoint.label} vs {twin}"


def bola_cases() -> list[Any]:
    cases = []
    for endpoint in WITH_IDS:
        [param] = endpoint.params
        for intruder in ("other tenant", "other user"):
            if intruder == "other user" and (endpoint.role or not KINDS[param].user_owned):
                continue  # a role check first (test below), or an object of the whole tenant
            cases.append(pytest.param(endpoint, intruder, id=f"{endpoint.label} as {intruder}"))
    return cases


@pytest.mark.parametrize("endpoint,intruder", bola_cases())
def test_a_foreign_object_answers_exactly_like_a_missing_one(client, sessions, endpoint, intruder):
    [param] = endpoint.params
    kind = KINDS[param]
    # Given an object of tenant A's alice
    object_id = kind.create(client)
    before = kind.fingerprint(object_id)
    missing_id = kind.missing()
    # When the intruder's session asks for it, and for an id that does not exist
    foreign = answer(call(sessions[intruder], endpoint, object_id), object_id)
    missing = answer(call(sessions[intruder], endpoint, missing_id), missing_id)
    if kind.shared:  # a queue: the intruder acts in its own scope (see test_bola.Kind)
        assert kind.fingerprint(object_id) == before, f"{endpoint.label} changed A's"
        assert foreign[0] < 500 and TENANT_A not in foreign[1], foreign[0]
        assert missing[0] == 404, missing[0]
        assert kind.undo is not None
        kind.undo(client, INTRUDERS[intruder], object_id)  # (its session's tenant and user)
        CHECKED.append(f"{endpoint.label} as {intruder}")
        return
    # Then both answers are the same 404, and nothing of A's changed
    assert foreign == missing, f"{endpoint.label} as {intruder}: {foreign[0]} != {missing[0]}"
    assert foreign[0] == 404 and kind.fingerprint(object_id) == before
    # And the owner's session does find it (the check above was not vacuous)
    owner = answer(call(sessions["owner"], endpoint, object_id), object_id)
    assert owner[0] != 404 or kind.fingerprint(object_id) != before, endpoint.label
    CHECKED.append(f"{endpoint.label} as {intruder}")


@pytest.mark.parametrize("endpoint", WITHOUT_IDS, ids=lambda e: e.label)
def test_collection_pages_show_nothing_of_another_tenant(client, sessions, endpoint):
    ids = [kind.create(client) for kind in KINDS.values() if not kind.shared]
    for kind in KINDS.values():
        if kind.shared:  # a queue's name is no secret (the page lists every queue)
            kind.create(client)
    response = call(sessions["other tenant"], endpoint)
    assert response.status_code < 500
    text = response.get_data(as_text=True)
    leaked = [value for value in [*ids, TENANT_A] if value in text]
    assert not leaked, f"{endpoint.label} shows tenant A's {leaked} to tenant B"
    CHECKED.append(endpoint.label)


NON_OPERATORS = {"no roles": (), "another role": ("viewer",), "role in another case": ("Operator",)}


@pytest.mark.parametrize("who", list(NON_OPERATORS))
@pytest.mark.parametrize(
    "endpoint", [e for e in GUARDED if e.role == OPERATOR], ids=lambda e: e.label
)
def test_a_non_operator_session_is_403_on_every_operator_endpoint(client, endpoint, who):
    refused_changing_nothing(client, signed_in(APP, TENANT_A, "vic", NON_OPERATORS[who]), endpoint)
    CHECKED.append(f"{endpoint.label} as {who}")


def refused_changing_nothing(client, session, endpoint) -> None:
    """``session`` gets 403 on ``endpoint``, for a real object and a missing one, and the
    real one is as it was."""
    ids = {p: KINDS[p].create(client) for p in endpoint.params}
    before = {p: KINDS[p].fingerprint(i) for p, i in ids.items()}
    on_real = call(session, endpoint, next(iter(ids.values()), None))
    on_missing = call(session, endpoint)
    assert (on_real.status_code, on_missing.status_code) == (403, 403), endpoint.label
    assert {p: KINDS[p].fingerprint(i) for p, i in ids.items()} == before


HOSTILE_IDS = ["x" * 300, "a%00b", "..", "%2e%2e", "%C3%BCnicode", "a%20b", "%ED%A0%80", "'--"]
HOSTILE_QUERIES = [
    "state=bogus",
    "cursor=%00",
    "cursor=" + "A" * 500,
    "limit=-1",
    "limit=1e9",
    "name=%00",
    "queue=a&queue=b",
    "verify=%ED%A0%80",
]
HOSTILE_FORMS = [
    {"reason": "a\x00" * 10},
    {"reason": "x" * 100_000},
    {"id": "%00", "data": "[" * 5000 + "]" * 5000},
    {"id": "ok-id", "rule": "every", "every": "9" * 40},
    {"id": "ok-id", "data": '{"rows": 1e999}'},
    {"id": "ok-id", "pattern": "* * * * * * *", "tz": "Mars/Olympus"},
    {"id": "x" * 300, "name": "report.generate", "opts": '{"attempts": "many"}'},
]
# The limit forms' fields, each form refused (a platform session sends them: nothing may be
# kept, and nothing is a 5xx).
HOSTILE_LIMIT_FORMS = [
    {"queue": "x" * 300, "concurrency": "9" * 40, "reason": "hostile: a long queue"},
    {"queue": MATRIX_LIMITS, "rate.max": "-1", "rate.durationMs": "1e999", "reason": "x" * 12},
    {"queue": MATRIX_LIMITS, "concurrency": "\uff11", "reason": "hostile: fullwidth one"},
    {"name": "%00", "key": "*" * 200, "maxRunning": "1", "reason": "hostile: a key"},
    {"name": "test.keyed", "tenant": MATRIX_LIMITS, "key": "k", "maxRunning": "1e3"},
    {"name": "test.keyed", "tenant": "\u2028", "key": "k", "maxRunning": "1", "reason": "x" * 12},
]
# What a form cannot hold but a client can send: bytes that are not UTF-8.
RAW_FORM = "csrf_token={token}&id=s&name=%ED%A0%80&reason=%FF%FE%00%00&data=%C0%AF"


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.label)
def test_hostile_input_is_a_4xx_never_a_5xx(endpoint):
    session = signed_in(APP, unique("hostile"), "mallory", (OPERATOR,))
    statuses = []
    for value in HOSTILE_IDS if endpoint.params else [None]:
        url = endpoint.url(value) if value else endpoint.url()
        for query in HOSTILE_QUERIES if endpoint.method == "GET" else [""]:
            if endpoint.method == "GET":
                response = session.get(f"{url}?{query}", headers=PAGE)
                statuses.append(response.status_code)
                response.close()
            else:
                for form in HOSTILE_FORMS:
                    if endpoint.endpoint == "ui.logout":  # each one signs the session out
                        session = signed_in(APP, unique("hostile"), "mallory", (OPERATOR,))
                    data = {"csrf_token": csrf_token(session), **form}
                    statuses.append(session.post(url, data=data, headers=PAGE).status_code)
                session = signed_in(APP, unique("hostile"), "mallory", (OPERATOR,))
                raw = RAW_FORM.format(token=csrf_token(session)).encode()
                response = session.post(
                    url, data=raw, content_type="application/x-www-form-urlencoded", headers=PAGE
                )
                statuses.append(response.status_code)
    assert statuses and max(statuses) < 500, f"{endpoint.label}: {sorted(set(statuses))}"
    CHECKED.append(f"{endpoint.label} hostile x{len(statuses)}")


def test_the_platform_role_reaches_the_pages_it_reads_and_no_other():
    """A new page is refused to platform sessions unless it says otherwise; this list is
    what it may open (every other page and form answers 403)."""
    assert {e.endpoint for e in GUARDED if reach(e) != "refused"} == PLATFORM_READS | PLATFORM_ACTS
    assert {e.endpoint for e in GUARDED if reach(e) == "only"} == {"ui.key_limits_page"}
    assert {e.endpoint for e in GUARDED if reach(e) == "acts"} == PLATFORM_ACTS


@pytest.mark.parametrize(
    "endpoint", [e for e in GUARDED if reach(e) == "refused"], ids=lambda e: e.label
)
def test_a_platform_session_is_403_on_every_action_and_tenant_page(client, endpoint):
    refused_changing_nothing(client, signed_in_platform(APP, unique("root")), endpoint)
    CHECKED.append(f"{endpoint.label} as platform")


TENANT_QUERIES = ["tenant=%00", "tenant=a/b", "tenant=" + "t" * 300, "tenant=x&tenant=%ED%A0%80"]
TENANT_SESSIONS = {
    "operator": (OPERATOR,),
    "a role named platform": (PLATFORM,),
    "operator and platform": (OPERATOR, PLATFORM),
}


@pytest.mark.parametrize("who", list(TENANT_SESSIONS))
@pytest.mark.parametrize(
    "endpoint", [e for e in GUARDED if reach(e) in ("only", "acts")], ids=lambda e: e.label
)
def test_the_platform_roles_own_pages_are_403_to_every_tenant_session(endpoint, who):
    session = signed_in(APP, TENANT_A, "vic", TENANT_SESSIONS[who])
    before = limit_changes()
    response = call(session, endpoint)
    assert response.status_code == 403, endpoint.label
    assert "platform role" in response.get_data(as_text=True)
    assert limit_changes() == before
    CHECKED.append(f"{endpoint.label} as a tenant's {who}")


def limit_changes() -> tuple[int, int]:
    """How many changes the matrix's queue and key limits have seen."""
    keyed = [c for c in live_key_limits.history("test.keyed", 500) if c.tenant == MATRIX_LIMITS]
    return len(live_limits.history(MATRIX_LIMITS)), len(keyed)


@pytest.mark.parametrize(
    "endpoint", [e for e in GUARDED if reach(e) != "refused"], ids=lambda e: e.label
)
def test_hostile_input_on_a_platform_sessions_pages_is_a_4xx_never_a_5xx(endpoint):
    """Every view a platform session opens is audited with its path and query as sent:
    hostile ones are kept (escaped), never a 5xx."""
    statuses = []
    for value in HOSTILE_IDS if endpoint.params else [None]:
        session = signed_in_platform(APP, unique("root"))
        url = endpoint.url(value) if value else endpoint.url()
        for query in [*HOSTILE_QUERIES, *TENANT_QUERIES] if endpoint.method == "GET" else [""]:
            if endpoint.method == "GET":
                response = session.get(f"{url}?{query}", headers=PAGE)
            else:
                for form in [HOSTILE_FORMS[0], *HOSTILE_LIMIT_FORMS]:
                    data = {"csrf_token": csrf_token(session), **form}
                    statuses.append(session.post(url, data=data, headers=PAGE).status_code)
                raw = RAW_FORM.format(token=csrf_token(session)).encode()
                response = session.post(
                    url, data=raw, content_type="application/x-www-form-urlencoded", headers=PAGE
                )
            statuses.append(response.status_code)
            response.close()
    assert statuses and max(statuses) < 500, f"{endpoint.label}: {sorted(set(statuses))}"
    assert limit_changes() == (0, 0), endpoint.label  # every hostile form was refused
    CHECKED.append(f"{endpoint.label} hostile as platform x{len(statuses)}")

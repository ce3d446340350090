"""``/api/v1/system/key-limits``: a job type's key limits overridden live, in the system scope.

Only the metrics token reads or changes them (a tenant's operator is 403: a job type's
limits are every tenant's); a bad body is a 400 naming the field, a job type that declares
no key limit a 404; every change is audited, and the audit refuses to be rewritten.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tasks.platform.db import transaction
from tests.support.client import bearer, metrics_headers, unique

SYSTEM = metrics_headers()
TENANT_OPERATOR = bearer("acme", "olga", roles=("operator",))
REASON = "partner incident: one call at a time"
LIST = "/api/v1/system/key-limits"
JOB = "test.keyed3"  # KeyConcurrency("partner", max_running=3), KeyRate("partner", 1000/s)


def url(name: str = JOB) -> str:
    return f"{LIST}/{name}"


def changes_of(client, key: str, name: str = JOB) -> list[dict]:
    found = client.get(url(name), headers=SYSTEM).get_json()["changes"]
    return [c for c in found if c["key"] == key]


@pytest.mark.parametrize(
    ("method", "path"), [("GET", LIST), ("GET", url()), ("PUT", url()), ("DELETE", url())]
)
@pytest.mark.parametrize(
    ("headers", "status"), [({}, 401), (bearer("acme", "alice"), 403), (TENANT_OPERATOR, 403)]
)
def test_only_the_system_scope_reads_or_changes_key_limits(client, method, path, headers, status):
    key = unique("p")
    answer = client.open(
        path,
        method=method,
        headers=headers,
        json={"key": key, "maxRunning": 1, "reason": REASON} if method == "PUT" else None,
        query_string={"key": key, "reason": REASON} if method == "DELETE" else None,
    )
    assert answer.status_code == status, answer.get_data(as_text=True)
    assert changes_of(client, key) == []


def test_an_override_is_shown_most_specific_first_and_audited(client):
    key = unique("p")
    # When any tenant's keys like it get 2, then acme's exact key 1 with no rate
    first = client.put(
        url(), json={"key": f"{key}*", "maxRunning": 2, "reason": REASON}, headers=SYSTEM
    )
    second = client.put(
        url(),
        json={"tenant": "acme", "key": key, "maxRunning": 1, "rate": None, "reason": REASON},
        headers=SYSTEM,
    )
    # Then each answers the job type's declaration and its overrides, most specific first
    assert first.status_code == second.status_code == 200, second.get_data(as_text=True)
    shown = second.get_json()
    assert shown["declared"] == {
        "key": "partner",
        "maxRunning": 3,
        "strategy": "queue",
        "rateKey": "partner",
        "rate": {"max": 1000, "durationMs": 1000},
    }
    mine = [o for o in shown["overrides"] if o["key"].startswith(key)]
    assert [(o["tenant"], o["key"], o.get("maxRunning"), o.get("rate", "-")) for o in mine] == [
        ("acme", key, 1, None),
        ("*", f"{key}*", 2, "-"),
    ]
    assert {(o["setBy"], o["reason"]) for o in mine} == {("api:metrics-token", REASON)}
    # And what holds for a key, and which override decides, is asked by key and tenant
    asked = client.get(url(), query_string={"tenant": "acme", "key": key}, headers=SYSTEM)
    assert asked.get_json()["inForce"] == {
        "tenant": "acme",
        "key": key,
        "maxRunning": 1,
        "rate": None,
        "maxRunningFrom": {"tenant": "acme", "key": key},
        "rateFrom": {"tenant": "acme", "key": key},
    }
    other = client.get(url(), query_string={"tenant": "globex", "key": key}, headers=SYSTEM)
    assert other.get_json()["inForce"]["maxRunning"] == 2
    assert other.get_json()["inForce"]["rateFrom"] == "declared"
    # And the list shows the job type, and the audit holds both changes, newest first
    listed = client.get(LIST, headers=SYSTEM).get_json()
    assert [j for j in listed["jobs"] if j["name"] == JOB] == [shown]
    assert [(c["tenant"], c["before"], c["after"]) for c in changes_of(client, key)] == [
        ("acme", None, {"maxRunning": 1, "rate": None})
    ]
    assert [(c["tenant"], c["after"]) for c in changes_of(client, f"{key}*")] == [
        ("*", {"maxRunning": 2})
    ]


def test_clearing_twice_changes_once(client):
    key = unique("p")
    client.put(url(), json={"key": key, "maxRunning": 2, "reason": REASON}, headers=SYSTEM)
    cleared = [
        client.delete(url(), query_string={"key": key, "reason": REASON}, headers=SYSTEM)
        for _ in range(2)
    ]
    assert [c.status_code for c in cleared] == [200, 200]
    assert [c.get_json()["changed"] for c in cleared] == [True, False]
    assert [o for o in cleared[1].get_json()["overrides"] if o["key"] == key] == []
    assert [(c["before"], c["after"]) for c in changes_of(client, key)] == [
        ({"maxRunning": 2}, None),
        (None, {"maxRunning": 2}),
    ]


@pytest.mark.parametrize(
    ("name", "body", "status", "field"),
    [
        (JOB, {"maxRunning": 1, "reason": REASON}, 400, "key"),
        (JOB, {"key": "p", "reason": REASON}, 400, "maxRunning"),
        (JOB, {"key": "p", "maxRunning": 0, "reason": REASON}, 400, "maxRunning"),
        (JOB, {"key": "p", "maxRunning": 10_001, "reason": REASON}, 400, "maxRunning"),
        (JOB, {"key": "p", "maxRunning": "2", "reason": REASON}, 400, "maxRunning"),
        (JOB, {"key": "p", "rate": {"max": 5}, "reason": REASON}, 400, "rate.durationMs"),
        (JOB, {"key": "", "maxRunning": 1, "reason": REASON}, 400, "key"),
        (JOB, {"key": "x" * 101, "maxRunning": 1, "reason": REASON}, 400, "key"),
        (JOB, {"key": "a\nb", "maxRunning": 1, "reason": REASON}, 400, "key"),
        (JOB, {"key": "p", "tenant": "", "maxRunning": 1, "reason": REASON}, 400, "tenant"),
        (JOB, {"key": "p", "maxRunning": 1}, 400, "reason"),
        (JOB, {"key": "p", "maxRunning": 1, "reason": REASON, "burst": 3}, 400, "burst"),
        # a limit the job type does not declare, or a strategy that keeps one job of a key
        ("test.keyed_rated", {"key": "p", "maxRunning": 2, "reason": REASON}, 400, "maxRunning"),
        (
            "test.keyed",
            {"key": "p", "rate": {"max": 1, "durationMs": 9}, "reason": REASON},
            400,
            "rate",
        ),
        ("test.keyed_first", {"key": "p", "maxRunning": 2, "reason": REASON}, 400, "maxRunning"),
        # a job type that declares no key limit, or none at all
        ("test.echo", {"key": "p", "maxRunning": 2, "reason": REASON}, 404, None),
        ("no.such.job", {"key": "p", "maxRunning": 2, "reason": REASON}, 404, None),
    ],
)
def test_a_bad_override_is_refused_naming_the_field(client, name, body, status, field):
    answer = client.put(url(name), json=body, headers=SYSTEM)
    assert answer.status_code == status, answer.get_data(as_text=True)
    refusal = answer.get_json()
    if field is None:
        assert "declares a key limit" in refusal["message"], refusal
        assert client.get(url(name), headers=SYSTEM).status_code == 404
    else:
        assert field in {d["field"] for d in refusal["details"]}, refusal


def test_a_lifted_limit_is_null_and_the_declaration_keeps_the_fields_left_out(client):
    key = unique("p")
    answer = client.put(
        url(), json={"key": key, "maxRunning": None, "reason": REASON}, headers=SYSTEM
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    asked = client.get(url(), query_string={"key": key}, headers=SYSTEM).get_json()["inForce"]
    assert (asked["maxRunning"], asked["rate"], asked["rateFrom"]) == (
        None,
        {"max": 1000, "durationMs": 1000},
        "declared",
    )


def test_a_clear_needs_a_key_and_a_reason(client):
    answer = client.delete(url(), headers=SYSTEM)
    assert answer.status_code == 400
    assert {"key", "reason"} <= {d["field"] for d in answer.get_json()["details"]}


@pytest.mark.parametrize(
    "statement", ["UPDATE key_limit_changes SET actor = 'x'", "DELETE FROM key_limit_changes"]
)
def test_the_audit_is_append_only(client, statement):
    body = {"key": unique("p"), "maxRunning": 1, "reason": REASON}
    client.put(url(), json=body, headers=SYSTEM)
    with pytest.raises(DBAPIError, match="append-only"), transaction() as session:
        session.execute(text(statement))

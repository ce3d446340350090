"""``/api/v1/system/queues/.../limits``: queue limits set live, in the system scope.

Only the metrics token changes or reads them (a tenant's operator is 403: a queue's
limits are every tenant's); a bad body is a 400 naming the field; every change is audited,
and the audit refuses to be rewritten.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tasks.platform.db import transaction
from tests.support.client import bearer, metrics_headers, unique

SYSTEM = metrics_headers()
TENANT_OPERATOR = bearer("acme", "olga", roles=("operator",))
REASON = "provider incident: halve the calls"


def url(queue: str) -> str:
    return f"/api/v1/system/queues/{queue}/limits"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/system/queues/limits"),
        ("GET", url("q")),
        ("PUT", url("q")),
        ("DELETE", url("q")),
    ],
)
@pytest.mark.parametrize(
    ("headers", "status"), [({}, 401), (bearer("acme", "alice"), 403), (TENANT_OPERATOR, 403)]
)
def test_only_the_system_scope_reads_or_changes_queue_limits(client, method, path, headers, status):
    queue = unique("q")
    answer = client.open(
        path.replace("/q/", f"/{queue}/"),
        method=method,
        headers=headers,
        json={"concurrency": 1, "reason": REASON} if method == "PUT" else None,
        query_string={"reason": REASON} if method == "DELETE" else None,
    )
    assert answer.status_code == status, answer.get_data(as_text=True)
    assert client.get(url(queue), headers=SYSTEM).get_json()["changes"] == []


def test_a_limit_set_live_replaces_the_fields_it_gives_and_is_audited(client):
    queue = unique("q")
    # When the concurrency, then the rate, are set live
    first = client.put(url(queue), json={"concurrency": 2, "reason": REASON}, headers=SYSTEM)
    second = client.put(
        url(queue),
        json={"rate": {"max": 5, "durationMs": 1000}, "concurrency": None, "reason": REASON},
        headers=SYSTEM,
    )
    # Then each answers the limits in force and where they come from
    assert first.status_code == second.status_code == 200, second.get_data(as_text=True)
    assert first.get_json()["effective"] == {"concurrency": 2, "rate": None}
    shown = second.get_json()
    assert shown["effective"] == {"concurrency": None, "rate": {"max": 5, "durationMs": 1000}}
    assert (shown["source"], shown["default"]) == ("live", None)
    assert (shown["override"]["setBy"], shown["override"]["reason"]) == (
        "api:metrics-token",
        REASON,
    )
    # And the list shows it, and the audit holds both changes, newest first
    listed = client.get("/api/v1/system/queues/limits", headers=SYSTEM).get_json()
    assert [q for q in listed["queues"] if q["queue"] == queue] == [shown]
    changes = client.get(url(queue), headers=SYSTEM).get_json()["changes"]
    assert [(c["before"], c["after"]) for c in changes] == [
        ({"concurrency": 2}, {"concurrency": None, "rate": {"max": 5, "durationMs": 1000}}),
        (None, {"concurrency": 2}),
    ]


def test_clearing_twice_changes_once(client):
    queue = unique("q")
    client.put(url(queue), json={"concurrency": 3, "reason": REASON}, headers=SYSTEM)
    cleared = [
        client.delete(url(queue), query_string={"reason": REASON}, headers=SYSTEM).get_json()
        for _ in range(2)
    ]
    assert [c["changed"] for c in cleared] == [True, False]
    assert (cleared[1]["source"], cleared[1]["effective"]) == ("none", None)
    assert len(client.get(url(queue), headers=SYSTEM).get_json()["changes"]) == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": REASON}, "concurrency"),
        ({"concurrency": 0, "reason": REASON}, "concurrency"),
        ({"concurrency": "2", "reason": REASON}, "concurrency"),
        ({"rate": {"max": 5}, "reason": REASON}, "rate.durationMs"),
        ({"rate": {"max": 0, "durationMs": 10}, "reason": REASON}, "rate.max"),
        ({"concurrency": 2}, "reason"),
        ({"concurrency": 2, "reason": "short"}, "reason"),
        ({"concurrency": 2, "reason": REASON, "burst": 3}, "burst"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(client, body, field):
    queue = unique("q")
    answer = client.put(url(queue), json=body, headers=SYSTEM)
    assert answer.status_code == 400, answer.get_data(as_text=True)
    assert field in {d["field"] for d in answer.get_json()["details"]}, answer.get_json()
    assert client.get(url(queue), headers=SYSTEM).get_json()["changes"] == []


def test_a_clear_needs_a_reason(client):
    answer = client.delete(url(unique("q")), headers=SYSTEM)
    assert answer.status_code == 400
    assert "reason" in {d["field"] for d in answer.get_json()["details"]}


@pytest.mark.parametrize(
    "statement", ["UPDATE queue_limit_changes SET actor = 'x'", "DELETE FROM queue_limit_changes"]
)
def test_the_audit_is_append_only(client, statement):
    client.put(url(unique("q")), json={"concurrency": 1, "reason": REASON}, headers=SYSTEM)
    with pytest.raises(DBAPIError, match="append-only"), transaction() as session:
        session.execute(text(statement))

"""Hostile bodies and ids that once made the API answer 500 (or worse, later, in beat or a worker).

Each case is a regression test for a defect found while building this tier
(schemathesis, or probing the edges schemathesis does not reach): the answer
must be a 4xx in the one error shape, naming what was wrong. Pass figure: 0 5xx.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.security.conftest import record_figure
from tests.support.client import bearer, unique

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("hostile")
OPERATOR = bearer(tenant=TENANT, user="mallory", roles=("operator",))
TEMPLATE = {"name": "report.generate", "data": {"reportId": "hostile", "rows": 1}}
SCHEDULER = "/api/v1/schedulers/{id}"
DEEP = "[" * 5000 + "]" * 5000
SEEN: list[int] = []


def send(client, method: str, url: str, body: Any) -> Any:
    data = body if isinstance(body, str) else json.dumps(body)
    return client.open(
        url, method=method, data=data, content_type="application/json", headers=OPERATOR
    )


def assert_refused(response, field: str | None = None) -> dict:
    SEEN.append(response.status_code)
    assert response.status_code == 400, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error", "message", "details"}
    if field is not None:
        assert field in [d["field"] for d in body["details"]], body
    return body


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    record_figure("hostile inputs", f"{len(SEEN)} sent, {sum(s >= 500 for s in SEEN)} 5xx")


@pytest.fixture(autouse=True)
def no_leftover_schedulers(drop_schedulers_of):
    drop_schedulers_of.append(TENANT)


HOSTILE_BODIES = [
    # (why, method, url, body, the field the 400 names)
    (
        "NUL in a stored string",
        "POST",
        "/api/v1/campaigns",
        {"name": "n", "category": "c", "template": "t", "recipients": [{"to": "\x00"}]},
        "recipients.0.to",
    ),
    (
        "NUL in a JSON key",
        "PUT",
        SCHEDULER,
        {"every": 1000, "template": {"name": "x", "data": {"a\x00": 1}}},
        "template.data.a\x00",
    ),
    (
        "unpaired surrogate",
        "POST",
        "/api/v1/campaigns",
        '{"name": "\\ud800", "category": "c", "template": "t", "recipientCount": 1}',
        "name",
    ),
    (
        "JSON nested 5000 deep",
        "POST",
        "/api/v1/campaigns",
        '{"name":"n","category":"c","template":"t","recipients":[{"to":"a","vars":{"k":'
        + DEEP
        + "}}]}",
        "(body)",
    ),
    (
        "every overflowing the calendar",
        "PUT",
        SCHEDULER,
        {"every": 10**20, "template": TEMPLATE},
        "every",
    ),
    (
        "cron after the last representable date",
        "PUT",
        SCHEDULER,
        {"pattern": "* * * * *", "startDate": "9999-12-31T23:59:59Z", "template": TEMPLATE},
        "(body)",
    ),
    (
        "cron that never matches (30 February)",
        "PUT",
        SCHEDULER,
        {"pattern": "0 0 30 2 *", "template": TEMPLATE},
        "(body)",
    ),
    (
        "template delay past any interval",
        "PUT",
        SCHEDULER,
        {"every": 1000, "template": {"name": "x", "opts": {"delay": 10**30}}},
        "template.opts.delay",
    ),
    (
        "template retention past any LIMIT",
        "PUT",
        SCHEDULER,
        {"every": 1000, "template": {"name": "x", "opts": {"removeOnFail": {"count": 10**30}}}},
        None,
    ),
    (
        "NUL in submitted job data",
        "POST",
        "/api/v1/jobs",
        {"name": "test.echo", "data": {"k": "a\x00b"}},
        "data.k",
    ),
    (
        "submitted delay past any interval",
        "POST",
        "/api/v1/jobs",
        {"name": "test.echo", "opts": {"delay": 10**30}},
        "opts.delay",
    ),
    (
        "submitted backoff doubling past any interval",
        "POST",
        "/api/v1/jobs",
        {
            "name": "test.echo",
            "opts": {"attempts": 100, "backoff": {"type": "exponential", "delay": 1000}},
        },
        "opts.backoff",
    ),
    (
        "submitted retention past any LIMIT",
        "POST",
        "/api/v1/jobs",
        {"name": "test.echo", "opts": {"removeOnFail": {"count": 10**30}}},
        None,
    ),
    (
        "a chosen job id (another tenant's, say)",
        "POST",
        "/api/v1/jobs",
        {"name": "test.echo", "opts": {"jobId": "repeat:0123:1700000000000"}},
        "opts.jobId",
    ),
    (
        "a deduplication id shared with another tenant",
        "POST",
        "/api/v1/jobs",
        {"name": "test.echo", "opts": {"deduplication": {"id": "their-key"}}},
        "opts.deduplication",
    ),
    (
        "runAt with no UTC equivalent",
        "POST",
        "/api/v1/reports/scheduled",
        {"reportId": "a", "rows": 1, "runAt": "9999-12-31T23:59:59-23:59"},
        "runAt",
    ),
    (
        "str.format attribute access",
        "POST",
        "/api/v1/campaigns",
        {"name": "n", "category": "c", "template": "{to.__class__}", "recipientCount": 1},
        "template",
    ),
    (
        "str.format 2 GB padding",
        "POST",
        "/api/v1/campaigns",
        {"name": "n", "category": "c", "template": "{to:>2000000000}", "recipientCount": 1},
        "template",
    ),
    (
        "positional placeholder",
        "POST",
        "/api/v1/campaigns",
        {"name": "n", "category": "c", "template": "{0}", "recipientCount": 1},
        "template",
    ),
]


@pytest.mark.parametrize(
    "method,url,body,field", [c[1:] for c in HOSTILE_BODIES], ids=[c[0] for c in HOSTILE_BODIES]
)
def test_a_hostile_body_is_a_400_naming_the_field(client, method, url, body, field):
    # Given an operator, when they send a body the store, beat or a worker could not handle
    response = send(client, method, url.format(id=unique("s")), body)
    # Then it is refused at the edge, in the error shape, naming the field
    assert_refused(response, field)


def test_an_existing_scheduler_cannot_be_updated_into_an_overflow(client):
    # Given a working scheduler
    url = SCHEDULER.format(id=unique("s"))
    assert send(client, "PUT", url, {"every": 1000, "template": TEMPLATE}).status_code == 200
    # When it is updated to a period past the calendar (this path computed start + every)
    response = send(client, "PUT", url, {"every": 10**20, "template": TEMPLATE})
    # Then 400, and the stored rule is unchanged
    assert_refused(response, "every")
    assert client.get(url, headers=OPERATOR).get_json()["every"] == 1000


def test_integral_floats_are_integers_as_json_schema_says(client):
    # Given a body whose integer fields are written 5.0 and 1e1 (integers to JSON Schema)
    body = {"reportId": unique(), "rows": 1e1, "failUntilAttempt": 0.0}
    # When posted, then it is accepted like 10 and 0
    response = send(client, "POST", "/api/v1/reports", body)
    SEEN.append(response.status_code)
    assert response.status_code == 202, response.get_json()
    # And a real fraction is still refused
    assert_refused(send(client, "POST", "/api/v1/reports", {"reportId": "a", "rows": 10.5}), "rows")


def test_nested_models_do_not_coerce_strings_to_numbers(client):
    # Given a scheduler whose nested template options carry "3" for an integer
    body = {"every": 1000, "template": {"name": "x", "opts": {"attempts": "3"}}}
    # Then the strict rule of every body holds at any depth
    assert_refused(
        send(client, "PUT", SCHEDULER.format(id=unique("s")), body), "template.opts.attempts"
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/reports/jobs/{bad}",
        "/api/v1/reports/jobs/{bad}/events",
        "/api/v1/campaigns/{bad}",
        "/api/v1/schedulers/{bad}",
        "/api/v1/jobs/{bad}",
    ],
)
@pytest.mark.parametrize(
    "bad",
    ["%00", "a%0Ab", "a%0A", "x" * 201],
    ids=["NUL", "newline", "trailing newline", "201 chars"],
)
def test_odd_path_ids_are_a_400_before_any_lookup(client, path, bad):
    # Given an id no record can have (NUL made psycopg raise: 500)
    response = client.get(path.format(bad=bad), headers=OPERATOR)
    # Then the documented path-parameter rule refuses it
    assert_refused(response)
    assert response.get_json()["details"][0]["type"] == "path_parameter"


@pytest.mark.parametrize("bad", ["-bad", "ok%0A"], ids=["leading dash", "trailing newline"])
def test_a_scheduler_id_outside_its_pattern_is_refused_on_put(client, bad):
    body = {"every": 1000, "template": TEMPLATE}
    assert_refused(send(client, "PUT", f"/api/v1/schedulers/{bad}", body), "scheduler_id")


HOSTILE_QUERIES = [
    # (why, query string, the parameter the 400 names)
    ("a huge limit", "limit=" + "9" * 400, "limit"),
    ("a negative limit", "limit=-1", "limit"),
    ("a state that does not exist", "state=deleted", "state"),
    ("a state in SQL", "state=waiting'%20OR%20'1'='1", "state"),
    ("a cursor that is not base64", "cursor=%24%24%24", "cursor"),
    ("a cursor of another shape", "cursor=eyJhIjogMX0", "cursor"),  # {"a": 1}
    ("a cursor with an unrepresentable date", "cursor=WyIxMDAwMDAtMDEtMDEiLCJ4Il0", "cursor"),
    ("a cursor past its length", "cursor=" + "A" * 401, "cursor"),
    ("NUL in a filter", "name=a%00b", "name"),
    ("a repeated filter", "queue=a&queue=b", "queue"),
]


@pytest.mark.parametrize(
    "query,field", [c[1:] for c in HOSTILE_QUERIES], ids=[c[0] for c in HOSTILE_QUERIES]
)
def test_a_hostile_listing_query_is_a_400_naming_the_parameter(client, query, field):
    assert_refused(client.get(f"/api/v1/jobs?{query}", headers=OPERATOR), field)

"""Hostile bodies and ids that once made the API answer 500 (or worse, later, in beat or a worker).

Each case is a regression test for a defect found while building this tier
(schemathesis, or probing the edges schemathesis does not reach): the answer
must be a 4xx in the one error shape, naming what was wrong. Pass figure: 0 5xx.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.security.conftest import documented_operations, record_figure, served_document
from tests.support.client import bearer, metrics_headers, unique
from tests.support.ui import csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("hostile")
OPERATOR = bearer(tenant=TENANT, user="mallory", roles=("operator",))
TEMPLATE = {"name": "report.generate", "data": {"reportId": "hostile", "rows": 1}}
SCHEDULER = "/api/v1/schedulers/{id}"
DEEP = "[" * 5000 + "]" * 5000
SEEN: list[int] = []


def send(client, method: str, url: str, body: Any) -> Any:
    """As a tenant's operator; a system-wide operation (``/api/v1/system/``) with the metrics
    token, the only one it takes (a tenant's token is 403 there before any body is read)."""
    data = body if isinstance(body, str) else json.dumps(body)
    headers = metrics_headers() if url.startswith("/api/v1/system/") else OPERATOR
    return client.open(
        url, method=method, data=data, content_type="application/json", headers=headers
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


# --- Numbers and digits: listed regressions first, then generated cases ----------------------

UI_PAGE = {"Accept": "text/html"}
REPORT_EVENTS = "/api/v1/reports/jobs/{id}/events"


def delayed_report(client) -> str:
    """A report job of the operator's that stays delayed: its stream never sees it end."""
    run_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = {"reportId": unique(), "rows": 1, "runAt": run_at}
    response = send(client, "POST", "/api/v1/reports/scheduled", body)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["jobId"]


def scheduler_form(app, **fields: str):
    """The dashboard's scheduler form as an operator submits it, with ``fields`` typed in."""
    operator = signed_in(app, TENANT, "mallory", ("operator",))
    form = {
        "csrf_token": csrf_token(operator),
        "id": unique("s"),
        "rule": "every",
        "every": "60000",
        "tz": "UTC",
        "name": "report.generate",
        "data": '{"reportId": "r", "rows": 5}',
        "opts": "{}",
        **fields,
    }
    return operator.post("/ui/schedulers", data=form, headers=UI_PAGE)


def assert_refused_page(response, field: str) -> None:
    SEEN.append(response.status_code)
    text = response.get_data(as_text=True)
    assert response.status_code == 400, text[-2000:]
    assert 'id="form-error"' in text and field in text


def test_a_number_past_the_float_range_in_job_data_is_a_400(client):
    # Given a body whose free-form data holds 1e400 (json.loads made it Infinity: Postgres refused)
    body = '{"name": "test.echo", "data": {"n": 1e400}}'
    # Then it is refused at the edge in the error shape
    assert_refused(send(client, "POST", "/api/v1/jobs", body))


def test_a_last_event_id_past_redis_range_is_a_400(client):
    # Given a stream id past 2**64 - 1 (Redis answered 'Invalid stream ID' mid-stream)
    url = REPORT_EVENTS.format(id=delayed_report(client)) + "?timeout=0.2"
    response = client.get(url, headers={**OPERATOR, "Last-Event-ID": "99999999999999999999"})
    # Then 400 naming the header, before any stream starts
    assert_refused(response, "Last-Event-ID")


@pytest.mark.parametrize("field,value", [("every", "²"), ("limit", "①")])
def test_a_non_ascii_digit_in_the_scheduler_form_is_a_400_page(app, field, value):
    # Given a character str.isdigit() takes but int() does not (it was a 500)
    response = scheduler_form(app, **{field: value})
    # Then the form comes back with 400 naming the field
    assert_refused_page(response, field)


def _non_ascii_digits() -> str:
    """Every character Python calls a digit or a decimal that is not 0-9."""
    found = (chr(c) for c in range(sys.maxunicode + 1))
    return "".join(c for c in found if (c.isdigit() or c.isdecimal()) and not c.isascii())


NON_ASCII_DIGITS = _non_ascii_digits()
FLOAT_MAX = sys.float_info.max


def _number_literal(sign: str, whole: int, fraction: str, exponent: int) -> str:
    return f"{sign}{whole}{'.' + fraction if fraction else ''}e{exponent}"


# JSON number literals around and past what a float holds (and integers far past 2**64).
JSON_NUMBERS = st.one_of(
    st.sampled_from(
        [
            "1.7976931348623157e308",  # the largest float
            "1.7976931348623159e308",  # rounds past it: inf
            "-1.7976931348623159e308",
            "1e308",
            "1E400",
            "1e+400",
            "-1e400",
            "1e-400",  # underflows to 0.0: a number, not an error
            "4.9e-324",
            "18446744073709551616",
            "9" * 400,
            "9" * 5000,  # past Python's int digit limit
        ]
    ),
    st.builds(
        _number_literal,
        st.sampled_from(["", "-"]),
        st.integers(1, 9),
        st.text("0123456789", max_size=17),
        st.integers(280, 500) | st.integers(-500, -280),
    ),
    st.integers(min_value=2**53, max_value=10**500).map(str),
)
NON_ASCII_NUMBERS = st.text(
    st.sampled_from(NON_ASCII_DIGITS) | st.sampled_from("0123456789"), min_size=1, max_size=6
).filter(lambda text: not text.isascii())


def _past_float_range(literal: str) -> bool:
    """A JSON float (a fraction or an exponent) that no double holds; JSON integers are ints."""
    return any(c in literal for c in ".eE") and not math.isfinite(float(literal))


def _numeric_fields(document: dict) -> list[tuple[str, str, str]]:
    """(method, path, dotted field) of every number and free-form object of every request body.

    Read from the served OpenAPI document, so a field added later is generated too.
    A free-form object (``data``, ``kwargs``, ...) gets a field ``n`` of its own.
    """
    schemas = document["components"]["schemas"]
    found: set[tuple[str, str, str]] = set()

    def walk(op, schema: dict, where: str, depth: int) -> None:
        if depth > 10:
            return
        if "$ref" in schema:
            walk(op, schemas[schema["$ref"].rsplit("/", 1)[1]], where, depth + 1)
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for inner in schema.get(key, []):
                walk(op, inner, where, depth + 1)
        kind = schema.get("type")
        if kind in ("integer", "number"):
            found.add((op.method.upper(), op.path, where))
        properties = schema.get("properties", {})
        for name, inner in properties.items():
            walk(op, inner, f"{where}.{name}" if where else name, depth + 1)
        if kind == "object" and not properties and where:
            found.add((op.method.upper(), op.path, f"{where}.n"))
        if kind == "array" and isinstance(schema.get("items"), dict):
            walk(op, schema["items"], f"{where}.0", depth + 1)

    for op in documented_operations(document):
        if op.body_schema:
            walk(op, {"$ref": f"#/components/schemas/{op.body_schema}"}, "", 0)
    return sorted(found)


NUMERIC_FIELDS = _numeric_fields(served_document())


def _base_body(method: str, path: str) -> dict[str, Any]:
    """A body the operation accepts, so a generated number reaches as far as it can."""
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    return {
        ("POST", "/api/v1/jobs"): {"name": "test.echo"},
        ("POST", "/api/v1/reports"): {"reportId": unique(), "rows": 1},
        ("POST", "/api/v1/reports/scheduled"): {"reportId": unique(), "rows": 1, "runAt": later},
        ("PUT", SCHEDULER): {"every": 60000, "template": {"name": "test.echo"}},
        ("PUT", "/api/v1/system/queues/{queue}/limits"): {"reason": "hostile input check"},
        ("PUT", "/api/v1/system/key-limits/{job_name}"): {
            "key": "partner-*",
            "reason": "hostile input check",
        },
    }.get((method, path.replace("{scheduler_id}", "{id}")), {})


def _with_literal(body: dict[str, Any], field: str, literal: str) -> str:
    """``body`` as JSON text with ``literal`` written raw at the dotted ``field``."""
    sentinel = "__generated_number__"
    here: Any = body
    parts = field.split(".")
    for part, following in itertools.pairwise(parts):
        nxt: Any = [] if following.isdigit() else {}
        if isinstance(here, list):
            while len(here) <= int(part):
                here.append(nxt)
            here = here[int(part)]
        else:
            here = here.setdefault(part, nxt)
            if not isinstance(here, dict | list):  # a number in the base body: replace it
                here = {}
    last = parts[-1]
    if isinstance(here, list):
        here.append(sentinel)
    else:
        here[last] = sentinel
    return json.dumps(body).replace(f'"{sentinel}"', literal)


GENERATED = settings(
    max_examples=15,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize(
    "method,path,field", NUMERIC_FIELDS, ids=[" ".join(f) for f in NUMERIC_FIELDS]
)
@GENERATED
@given(literal=JSON_NUMBERS)
def test_json_numbers_at_and_past_the_float_range_never_5xx(client, method, path, field, literal):
    # Given a body the operation takes, with a generated number literal in one numeric field
    url = path.replace("{scheduler_id}", unique("s")).replace("{queue}", "hostile-q")
    body = _with_literal(_base_body(method, path), field, literal)
    # When it is sent
    response = send(client, method, url, body)
    SEEN.append(response.status_code)
    # Then never a server error; a number no float holds is a 400 in the error shape
    assert response.status_code < 500, (literal[:40], response.get_data(as_text=True))
    if _past_float_range(literal):
        assert_refused(response)
    elif response.status_code >= 400:
        assert set(response.get_json()) == {"error", "message", "details"}


@pytest.mark.parametrize(
    "method,path,field", NUMERIC_FIELDS, ids=[" ".join(f) for f in NUMERIC_FIELDS]
)
@GENERATED
@given(digits=NON_ASCII_NUMBERS)
def test_non_ascii_digits_in_a_numeric_api_field_are_a_400(client, method, path, field, digits):
    url = path.replace("{scheduler_id}", unique("s")).replace("{queue}", "hostile-q")
    # as a string (a strict number field takes no string) and as a bare literal (not JSON)
    for written in (json.dumps(digits), digits):
        body = _with_literal(_base_body(method, path), field, written)
        if field.endswith(".n") and written.startswith('"'):
            continue  # a free-form object may hold any string
        assert_refused(send(client, method, url, body))


@GENERATED
@given(digits=NON_ASCII_NUMBERS)
def test_non_ascii_digits_in_numeric_query_parameters_are_a_400(client, digits):
    job_id = JOB_FOR_STREAMS.setdefault("id", delayed_report(client))
    # GET /api/v1/jobs?limit= (documented) and the event stream's ?timeout= (read by hand)
    assert_refused(client.get(f"/api/v1/jobs?limit={digits}", headers=OPERATOR), "limit")
    url = REPORT_EVENTS.format(id=job_id) + f"?timeout={digits}"
    assert_refused(client.get(url, headers=OPERATOR), "timeout")


JOB_FOR_STREAMS: dict[str, str] = {}
U64 = 2**64 - 1


@GENERATED
@given(
    ms=st.integers(0, 2**70) | st.sampled_from([U64, U64 + 1]),
    seq=st.none() | st.integers(0, 2**70) | st.sampled_from([U64, U64 + 1]),
    digits=st.none() | NON_ASCII_NUMBERS,
)
def test_last_event_id_is_a_redis_stream_id_or_a_400(client, ms, seq, digits):
    job_id = JOB_FOR_STREAMS.setdefault("id", delayed_report(client))
    last = digits or (f"{ms}" if seq is None else f"{ms}-{seq}")
    url = REPORT_EVENTS.format(id=job_id) + "?timeout=0.05"
    response = client.get(url, headers={**OPERATOR, "Last-Event-ID": last})
    in_range = digits is None and ms <= U64 and (seq is None or seq <= U64)
    if in_range:
        # Then a stream id Redis can hold is resumed after, and the stream ends cleanly
        assert response.status_code == 200, response.get_data(as_text=True)
        response.get_data()
        SEEN.append(200)
    else:
        assert_refused(response, "Last-Event-ID")


@GENERATED
@given(field=st.sampled_from(["every", "limit"]), digits=NON_ASCII_NUMBERS)
def test_non_ascii_digits_in_the_scheduler_forms_number_fields_are_a_400_page(app, field, digits):
    assert_refused_page(scheduler_form(app, **{field: digits}), field)


@GENERATED
@given(field=st.sampled_from(["data", "opts"]), literal=JSON_NUMBERS.filter(_past_float_range))
def test_numbers_past_the_float_range_in_the_scheduler_forms_json_are_a_400_page(
    app, field, literal
):
    typed = {"data": f'{{"reportId": "r", "rows": {literal}}}', "opts": f'{{"delay": {literal}}}'}
    assert_refused_page(scheduler_form(app, **{field: typed[field]}), f"template.{field}")

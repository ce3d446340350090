"""Scenario 9: schemathesis against ``/api/v1/openapi.json``, every operation.

Pass figure: 0 server errors (5xx), invalid data rejected, valid data accepted,
every response in the declared status codes, content types and schemas.

The schema is read from the app itself through WSGI (no server), and every
request carries an operator's bearer token of a tenant of its own. The
default run tries a modest number of examples per operation; the slow tier
tries at least 200 per operation.

A few rules of the contract cannot be said in JSON Schema (a time "in the
future", a valid cron pattern, an IANA zone name, end after start, no NUL). A valid-
looking body that breaks only such a rule is refused with 400 naming exactly
that field; ``CONTRACT_RULES`` lists them, and only those 400s are excused from
schemathesis's "valid data is accepted" check. Every other check still runs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tasks.jobs.schedule import schedulers
from tasks.platform import db
from tasks.platform.config import reload_settings
from tests.security.conftest import OPENAPI, documented_operations, record_figure
from tests.support.client import bearer, unique
from web import create_app
from web.events import TIMEOUT

FAST_EXAMPLES = 25
SLOW_EXAMPLES = 300
TENANT = unique("fuzz")
OPERATOR = bearer(tenant=TENANT, user="fuzzer", roles=("operator",))
# Enough for any campaign the fuzzer starts to stay small if a worker of the
# session picks it up: the fuzzer tests the API's edge, not the provider.
MAX_FUZZ_RECIPIENTS = 20

# (method, path) -> {body field: the rule JSON Schema cannot state}
CONTRACT_RULES: dict[tuple[str, str], dict[str, str]] = {
    ("POST", "/api/v1/reports/scheduled"): {
        "runAt": "must be in the future, and at most maxDelaySeconds ahead",
    },
    ("PUT", "/api/v1/schedulers/{scheduler_id}"): {
        "pattern": "must be a valid cron expression",
        "tz": "must be an IANA time zone",
        "(body)": "endDate after startDate, and fire times inside the calendar",
        "template.name": "must name a job its tenant may schedule",
        "template.data": "must be data that job takes, with no identity fields",
        "queue": "must be the queue of the template's job",
    },
    ("POST", "/api/v1/campaigns"): {
        "template": "must render no message past the provider's 10,000 characters",
    },
    ("GET", "/api/v1/jobs"): {
        "cursor": "must be a nextCursor this API returned",
        "data": "must be path=value terms or a JSON object (tasks.jobs.model.search)",
    },
    ("GET", "/api/v1/events"): {
        "queue": "must be queues a job type runs on",
        "timeout": "must be in (0, 300] seconds",
    },
    ("POST", "/api/v1/webhooks"): {
        "url": "must be a public http(s) URL, without credentials (tasks.jobs.model.webhooks)",
    },
    ("POST", "/api/v1/bulk-actions"): {
        "filter.states": "must be states the action acts on",
        "filter.queue": "drain needs a queue",
    },
    ("POST", "/api/v1/jobs"): {
        "name": "must name a job its tenant may submit",
        "data": "must be data that job takes, with no identity fields; not with args/kwargs",
        "args": "only for a Celery-style task",
        "kwargs": "only for a Celery-style task, with no identity fields",
        "opts.backoff": "its longest wait must be at most maxDelaySeconds",
    },
}

# Detail types that may answer any operation: JSON Schema strings may hold NUL and
# lone surrogates, which no Postgres column (nor UTF-8) can store, and free-form
# objects may nest without end, which the API caps (web.api.MAX_JSON_DEPTH).
EVERYWHERE = {"invalid_character", "too_deep"}

# The app is built at import so schemathesis can parametrize by operation; it
# talks to Postgres/Redis only when a test runs, after the ``stack`` fixture.
# The tenant rate limit is off here: a fuzzer is a flood by design, and the
# limit has its own scenario (test_resource_limits).
APP = create_app({"TESTING": True, "KEEL_TENANT_RATE_LIMIT": "off"})
SCHEMA = schemathesis.openapi.from_wsgi(OPENAPI, APP)
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])

# a worker too, so that GET /readyz answers 200 (ready), not 503
pytestmark = pytest.mark.usefixtures("stack", "worker", "fuzz_tenant", "patient_store")


@pytest.fixture(scope="module")
def patient_store() -> Iterator[None]:
    """A 10 s database budget per request for this module (``KEEL_REQUEST_DEADLINE_S``).

    The fuzzer asks what input does to the API. Whether the 1 s budget holds,
    and a slow store is answered 503 in time, is tests/serving's question; on a
    shared two-core host a busy second is not an input bug.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEEL_REQUEST_DEADLINE_S", "10")
        reload_settings()
        db.dispose()
        yield
    reload_settings()
    db.dispose()


_TALLY_LOCK = threading.Lock()
# tier ("fast" / "slow") -> operation -> {"requests", "5xx"}
TALLY: dict[str, dict[str, Counter]] = {"fast": {}, "slow": {}}


@pytest.fixture(scope="module")
def fuzz_tenant() -> Iterator[str]:
    """The fuzzer's tenant; its job schedulers are removed afterwards so no beat fires them."""
    yield TENANT
    scope = schedulers.Scope(tenant_id=TENANT)
    for record in schedulers.list_all(scope):
        schedulers.remove(scope, record.id)


@pytest.fixture(scope="module", autouse=True)
def report_figures() -> Iterator[None]:
    yield
    for tier, tally in TALLY.items():
        if tally:
            sent = [t["requests"] for t in tally.values()]
            record_figure(
                f"schemathesis ({tier})",
                f"{len(tally)} operations x {min(sent)}..{max(sent)} requests each "
                f"({sum(sent)} in all), {sum(t['5xx'] for t in tally.values())} 5xx",
            )


def label(case: schemathesis.Case) -> str:
    """The documented operation (a case may probe it with another method, e.g. TRACE)."""
    return case.operation.label


def keep_campaigns_small(case: schemathesis.Case) -> None:
    """Shrink a *valid* synthetic recipient count; invalid ones are left to be refused."""
    if (case.method.upper(), case.operation.path) != ("POST", "/api/v1/campaigns"):
        return
    body = case.body
    if isinstance(body, dict):
        count = body.get("recipientCount")
        if type(count) is int and 1 <= count <= 1_000_000:
            body["recipientCount"] = min(count, MAX_FUZZ_RECIPIENTS)


def keep_streams_short(case: schemathesis.Case) -> None:
    """An event stream stays open ``timeout`` seconds (30 when not given): a *valid* or absent
    one is cut to a tenth of a second, so that the fuzzer's examples each end at once."""
    if (case.method.upper(), case.operation.path) != ("GET", "/api/v1/events"):
        return
    query = case.query
    if isinstance(query, dict) and _valid_or_absent(query.get("timeout")):
        query["timeout"] = "0.1"


def _valid_or_absent(timeout: Any) -> bool:
    if timeout is None:
        return True
    return isinstance(timeout, str) and bool(TIMEOUT.fullmatch(timeout)) and float(timeout) <= 300


def breaks_only_contract_rules(case: schemathesis.Case, response: Any) -> bool:
    """A 400 whose every detail is a rule of ``CONTRACT_RULES`` (or ``EVERYWHERE``), or the
    422 of an ``Idempotency-Key`` the generator sent again with another body (it repeats
    short keys; a key is one request's: ``web.idempotency``)."""
    if response.status_code == 422:
        return response.json().get("error") == "idempotency_key_reused"
    if response.status_code != 400:
        return False
    rules = CONTRACT_RULES.get((case.method.upper(), case.operation.path), {})
    body = response.json()
    details = [d for d in body.get("details", []) if isinstance(d, dict)]
    return (
        body.get("error") == "validation_failed"
        and bool(details)
        and all(d.get("type") in EVERYWHERE or d.get("field") in rules for d in details)
    )


def exercise(case: schemathesis.Case, tier: str) -> None:
    """Send one generated request and run every schemathesis check on its answer."""
    keep_campaigns_small(case)
    keep_streams_short(case)
    response = case.call(headers=OPERATOR)
    with _TALLY_LOCK:
        tally = TALLY[tier].setdefault(label(case), Counter())
        tally["requests"] += 1
        tally["5xx"] += response.status_code >= 500
    # Then no server error, whatever the input
    assert response.status_code < 500, response.text
    excluded = [positive_data_acceptance] if breaks_only_contract_rules(case, response) else []
    case.validate_response(response, headers=OPERATOR, excluded_checks=excluded)


@SCHEMA.parametrize()
@settings(
    max_examples=FAST_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_survives_generated_input(case: schemathesis.Case) -> None:
    """Given an operator of a fresh tenant, when schemathesis sends valid and invalid
    requests to an operation, then none is a 5xx and every answer matches the document."""
    exercise(case, "fast")


@pytest.mark.slow
@SCHEMA.parametrize()
@settings(
    max_examples=SLOW_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_survives_many_generated_inputs(case: schemathesis.Case) -> None:
    """The same, with at least 200 generated examples per operation (random seed)."""
    exercise(case, "slow")


def fuzzed_operations() -> set[str]:
    """What schemathesis should reach: every documented operation but the document itself
    (schemathesis leaves out the schema it was loaded from; test_bola and test_roles call it)."""
    return {op.label for op in documented_operations()} - {f"GET {OPENAPI}"}


def takes_input(label: str) -> bool:
    """Operations with a path parameter or a body: the ones with room for 200 distinct inputs."""
    return any(
        op.label == label and (op.path_params or op.body_schema) for op in documented_operations()
    )


def test_the_fuzzer_reached_every_operation_without_a_server_error() -> None:
    """Given the default run above, then every operation was exercised and 0 answers were 5xx."""
    tally = TALLY["fast"]
    if not tally:
        pytest.skip("the generated-input tests were deselected")
    missed = fuzzed_operations() - set(tally)
    assert not missed, f"operations never fuzzed: {sorted(missed)}"
    assert sum(t["5xx"] for t in tally.values()) == 0


@pytest.mark.slow
def test_the_slow_fuzzer_sent_200_inputs_to_every_operation_without_a_server_error() -> None:
    """Given the slow run above, then every operation that takes input got >= 200 requests
    (healthz/metrics take none, so hypothesis runs out of distinct ones) and 0 were 5xx."""
    tally = TALLY["slow"]
    if not tally:
        pytest.skip("the generated-input tests were deselected")
    missed = fuzzed_operations() - set(tally)
    assert not missed, f"operations never fuzzed: {sorted(missed)}"
    few = {op: t["requests"] for op, t in tally.items() if takes_input(op) and t["requests"] < 200}
    assert not few, f"fewer than 200 requests: {few}"
    assert sum(t["5xx"] for t in tally.values()) == 0

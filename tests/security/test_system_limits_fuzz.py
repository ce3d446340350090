"""schemathesis against the system-wide limit endpoints (``/api/v1/system/queues/…`` and
``/api/v1/system/key-limits/…``) with the credential that passes their auth (the metrics
token), so that generated bodies, queries and paths reach validation and the store: no
5xx, invalid input refused (400 naming the field), valid input accepted, every answer as
documented. ``test_fuzz`` covers them with a tenant's token (403)."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from tests.security.conftest import OPENAPI
from tests.support.client import metrics_headers
from web import create_app

APP = create_app({"TESTING": True})
SCHEMA = schemathesis.openapi.from_wsgi(OPENAPI, APP).include(
    path_regex="^/api/v1/system/(queues|key-limits)"
)
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
# Valid requests only: a negative case made valid by naming the declaring type would be
# "invalid input accepted" (invalid input has the test above).
DECLARING = schemathesis.openapi.from_wsgi(OPENAPI, APP).include(
    path_regex="^/api/v1/system/key-limits"
)
DECLARING.config.generation.update(modes=[GenerationMode.POSITIVE])
GENERATED = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

pytestmark = pytest.mark.usefixtures("stack")
REACHED: Counter[str] = Counter()  # the operations each generated case was sent to


def exercise(case: schemathesis.Case) -> None:
    REACHED[case.operation.label] += 1
    headers = metrics_headers()
    response = case.call(headers=headers)
    assert response.status_code < 500, response.text
    case.validate_response(response, headers=headers)


@SCHEMA.parametrize()
@GENERATED
def test_the_limit_endpoints_survive_generated_input(case: schemathesis.Case) -> None:
    exercise(case)


@DECLARING.parametrize()
@GENERATED
def test_the_key_limit_endpoints_survive_generated_input_for_a_declaring_job_type(
    case: schemathesis.Case,
) -> None:
    """The same, on a job type that declares key limits: generated overrides reach the rules
    (``key_overrides.checked``) and the store, not only the 404 of an unknown name."""
    if case.path_parameters and "job_name" in case.path_parameters:
        case.path_parameters["job_name"] = "test.keyed3"
    exercise(case)


def test_the_generated_input_reached_every_limit_operation() -> None:
    """Given the runs above, then each limit operation was sent cases (under pytest-xdist,
    items sharing a node id ran as one: tests/security/conftest.py)."""
    if not REACHED:
        pytest.skip("the generated-input tests were deselected")
    expected = {result.ok().label for result in SCHEMA.get_all_operations()}
    assert expected - set(REACHED) == set(), sorted(expected - set(REACHED))

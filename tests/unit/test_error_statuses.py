"""How Keel's errors answer over HTTP: one table in ``web/errors.py``, by family.

The job layer's exceptions carry no HTTP status; a refusal answers 4xx, an
unavailable part 503 with Retry-After, and control flow reaching a view is a
bug (500, logged), never a 400 that hides it.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import tasks
from tasks.jobs.model import errors
from web import errors as web_errors


def every_subclass(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *every_subclass(sub)}
    return found


@pytest.fixture(scope="module")
def keel_errors() -> set[type]:
    for module in pkgutil.walk_packages(tasks.__path__, "tasks."):
        importlib.import_module(module.name)
    return every_subclass(errors.KeelError)


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (errors.JobNotFound(), 404, "not_found"),
        (errors.InvalidJobState(), 400, "invalid_state"),
        (errors.JobConflict(), 409, "conflict"),
        (errors.QuotaExceeded(), 429, "quota_exceeded"),
        (errors.LimitExceeded(), 400, "validation_failed"),
        (errors.Refused("limit must be 1..500"), 400, "bad_request"),
        (errors.BrokerUnavailable(), 503, "broker_unavailable"),
        (errors.Defer(100), 500, "deferred"),
        (errors.UnrecoverableError("no"), 500, "unrecoverable"),
        (errors.KeelError("plain"), 500, "internal_error"),
    ],
)
def test_each_family_answers_by_the_table(error, status, code):
    assert web_errors.status_of(error) == status
    if status < 500:
        assert web_errors.code_of(error) == code
    if status == 503:
        assert web_errors.headers_of(error) == {"Retry-After": str(web_errors.RETRY_AFTER_S)}


def test_no_exception_of_the_tasks_tree_carries_an_http_status(keel_errors):
    carrying = sorted(c.__qualname__ for c in keel_errors if "status" in vars(c))
    assert carrying == [], carrying


def test_control_flow_never_answers_as_a_callers_error(keel_errors):
    flows = [c for c in keel_errors if issubclass(c, errors.ControlFlow)]
    assert {"Defer", "UnrecoverableError", "NotOurs", "LimitReached"} <= {c.__name__ for c in flows}
    for cls in flows:
        assert not any(k in web_errors.STATUSES for k in cls.__mro__ if k is not errors.KeelError)

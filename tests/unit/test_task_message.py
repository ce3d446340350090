"""A Keel message's Celery part (``messages._built``) is what Celery's ``AMQP.as_task_v2``
writes for the same arguments; where an app's ``as_task_v2`` is another, it is that."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
from celery.app.amqp import AMQP
from kombu.utils import json

from tasks.jobs.intake import messages

CASES: list[dict[str, Any]] = [
    {},
    {"create_sent_event": True, "origin": "gen1@host", "reply_to": "r-1"},
    {"root_id": "root", "parent_id": "parent", "create_sent_event": True},
    {
        "group_id": "g-1",
        "group_index": 3,
        "chord": {"task": "body", "args": [], "kwargs": {}, "options": {}},
        "callbacks": [{"task": "link"}],
        "errbacks": [{"task": "on-error"}],
        "chain": [{"task": "next"}],
        "time_limit": 30.0,
        "soft_time_limit": 20.0,
        "ignore_result": True,
    },
]


@pytest.mark.parametrize("data", [{}, {"n": 1, "s": "é"}])
@pytest.mark.parametrize("given", CASES)
def test_built_is_celerys_as_task_v2(given: dict[str, Any], data: dict[str, Any]) -> None:
    options = {"argsrepr": "()", "kwargsrepr": repr(data), **given}
    ours = messages._built("job-1", "test.echo", (), data, **options)
    celerys = messages._settings().amqp.as_task_v2("job-1", "test.echo", (), data, **options)
    # as written: key order and types too, not only equal values
    assert json.dumps(tuple(ours)) == json.dumps(tuple(celerys))


def test_data_that_is_not_a_mapping_is_refused_as_celery_refuses_it() -> None:
    with pytest.raises(TypeError, match="must be a mapping"):
        messages._built("j", "t", (), [1, 2], argsrepr="()", kwargsrepr="[1, 2]")


def test_an_app_with_another_as_task_v2_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stamping(AMQP):
        def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
            made = super().as_task_v2(*args, **kwargs)
            made.headers["stamp"] = "theirs"
            return made

    settings = messages._settings()
    assert messages._as_task_v2(settings) == messages._built  # Celery's own: ours
    theirs = Stamping(settings.amqp.app)
    monkeypatch.setattr(messages, "_BUILT_MATCHES", weakref.WeakKeyDictionary())
    chosen = messages._as_task_v2(settings._replace(amqp=theirs))
    assert chosen == theirs.as_task_v2
    assert chosen("j", "t", (), {}, argsrepr="()", kwargsrepr="{}").headers["stamp"] == "theirs"


def test_an_as_task_v2_wrapped_on_the_instance_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = messages._settings()
    amqp = AMQP(settings.amqp.app)
    celerys = amqp.as_task_v2

    def wrapped(*args: Any, **kwargs: Any) -> Any:  # e.g. an instrumentation's wrapper
        return celerys(*args, **kwargs)

    monkeypatch.setattr(amqp, "as_task_v2", wrapped, raising=False)
    assert messages._as_task_v2(settings._replace(amqp=amqp)) is wrapped

"""A batch's messages (``messages_for``): a job that takes an earlier job's message ``alike``
gets, as written, what ``Message`` builds for it on its own."""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from kombu.utils import json

from tasks.jobs.intake import messages, tenancy
from tasks.jobs.intake.messages import Message, messages_for
from tasks.jobs.model import registry
from tasks.notifications.jobs import CREATE


@dataclass
class Job:
    id: str
    name: str
    queue: str
    data: Any
    celery_ctx: dict[str, Any] | None = None
    tenant_id: str | None = None


def one_by_one(jobs: list[Job], priority: dict[str, int], parent: Any) -> list[Message]:
    return [
        Message(
            job.id,
            job.name,
            job.queue,
            job.data,
            job.celery_ctx,
            priority=priority.get(job.id, 0),
            parent=parent,
            tenant=job.tenant_id,
        )
        for job in jobs
    ]


def written(message: Message) -> str:
    """Everything a message is, as written: key order and types included."""
    parts = [message.name, message.queue, message.plain, message.trace, message.headers]
    return json.dumps([*parts, message.properties, list(message.body), message.sent])


def a_batch(rng: random.Random) -> list[Job]:
    names = ["test.echo", "test.celery_retry", CREATE]
    jobs = []
    for n in range(60):
        name = rng.choice(names)
        if name == "test.celery_retry":  # a Celery-style call's data: shown as the call
            data: Any = {"args": [n, "x" * rng.choice([1, 300])], "kwargs": {"k": n}}
        else:
            data = rng.choice([{}, {"n": n}, {"n": n, "long": "y" * 2000}, {"s": "é"}])
        ctx = rng.choice([None, None, None, {}, {"root_id": "r", "parent_id": "p"}])
        jobs.append(
            Job(
                f"job-{n}",
                name,
                rng.choice(["q1", "q2"]),
                data,
                ctx,
                rng.choice([None, "acme", "globex"]),
            )
        )
    return jobs


def run(root_id: str | None, task_id: str) -> SimpleNamespace:
    """A running task, as ``app.current_worker_task`` gives it."""
    return SimpleNamespace(request=SimpleNamespace(root_id=root_id, id=task_id))


PARENTS = [
    None,
    run("root-0", "parent-0"),
    run(None, "parent-0"),  # a root run: its own id is the root
    run("job-0", "parent-0"),  # its root is a job of the batch (an explicit root_id=)
    run(None, "job-0"),
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("sent_events", [True, False])
@pytest.mark.parametrize(
    "parent", PARENTS, ids=["no run", "in a run", "a root run", "root a job", "run a job"]
)
def test_a_batch_is_written_as_each_message_on_its_own(
    seed: int, sent_events: bool, parent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = messages._settings()
    chosen = settings._replace(send_sent_event=sent_events)
    monkeypatch.setattr(messages, "_process_settings", chosen)
    rng = random.Random(seed)
    jobs = a_batch(rng)
    priority = {job.id: rng.randrange(0, 10) for job in jobs}
    batch = messages_for(jobs, priority, parent)
    alone = one_by_one(jobs, priority, parent)
    assert [written(m) for m in batch] == [written(m) for m in alone]


def test_only_the_first_of_each_type_queue_and_tenant_is_built_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    init = Message.__init__

    def counting(self: Message, job_id: str, *args: Any, **kwargs: Any) -> None:
        built.append(job_id)
        init(self, job_id, *args, **kwargs)

    monkeypatch.setattr(Message, "__init__", counting)
    jobs = [Job(f"a{n}", "test.echo", "q1", {"n": n}) for n in range(5)]
    jobs += [Job("b0", "test.echo", "q1", {"n": 0}, tenant_id="acme")]
    jobs += [Job("c0", "test.echo", "q2", {"n": 0}), Job("c1", "test.echo", "q2", {"n": 1})]
    jobs += [Job("d0", "test.echo", "q1", {"n": 0}, {"root_id": "r", "parent_id": "p"})]
    messages_for(jobs, {}, None)
    assert built == ["a0", "b0", "c0", "d0"]  # a job with context is built whole


def test_data_that_is_not_a_dict_is_refused_as_on_its_own() -> None:
    jobs = [Job("a0", "test.echo", "q1", {"n": 0}), Job("a1", "test.echo", "q1", [1, 2])]
    with pytest.raises(TypeError, match="must be a mapping"):
        messages_for(jobs, {}, None)


def test_a_control_job_alike_stays_at_the_front() -> None:
    assert registry.is_control(CREATE)
    jobs = [Job(f"g{n}", CREATE, "q1", {"n": n}) for n in range(3)]
    made = messages_for(jobs, {job.id: 9 for job in jobs}, None)
    front = tenancy.broker_priority(0)
    assert front != tenancy.broker_priority(9)
    assert {m.properties["priority"] for m in made} == {front}


def test_messages_alike_share_nothing_a_receiver_could_change() -> None:
    jobs = [Job(f"a{n}", "test.echo", "q1", {"n": n}) for n in range(3)]
    made = messages_for(jobs, {}, None)
    before = [written(m) for m in made]
    # what a before_task_publish receiver is given: headers, properties and body
    made[1].headers["stamp"] = "x"
    made[1].headers["timelimit"].append(1)
    made[1].headers["stamps"]["s"] = 1
    made[1].properties["extra"] = 1
    made[1].body[2]["chain"] = [{"task": "next"}]
    assert made[1].sent is not None or made[0].sent is None
    if made[1].sent is not None:
        made[1].sent["extra"] = 1
    assert [written(m) for m in (made[0], made[2])] == [before[0], before[2]]


def test_a_job_whose_record_no_message_can_be_built_from_is_left_out_when_asked() -> None:
    jobs = [Job("a0", "test.echo", "q1", {"n": 0}), Job("a1", "test.echo", "q1", [1, 2])]
    jobs += [Job("a2", "test.echo", "q1", {"n": 2}), Job("a3", "test.echo", "q1", {}, ["x"])]  # type: ignore[arg-type]
    jobs += [Job("a4", "test.echo", "q1", {}, {"timelimit": 5})]
    jobs += [Job("a5", "test.echo", "q1", {}, {"headers": "h"})]
    refused: dict[str, str] = {}
    made = messages_for(jobs, {}, None, refused)
    assert [m.headers["id"] for m in made] == ["a0", "a2"]
    assert refused == {
        "a1": "its data is not an object but list",
        "a3": "its context is not an object but list",
        "a4": "its time limits are not a pair: 5",
        "a5": "its call's headers are not an object but str",
    }


def test_an_error_that_is_not_the_records_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug, not a record")

    monkeypatch.setattr(messages, "_as_task_v2", lambda settings: broken)
    with pytest.raises(TypeError, match="a bug"):
        messages_for([Job("a0", "test.echo", "q1", {"n": 0})], {}, None, {})


@pytest.mark.parametrize("args, kwargs", [(5, {}), ([1], "ab"), ("xy", None)])
def test_a_celery_style_call_of_another_shape_is_shown_whole(args: Any, kwargs: Any) -> None:
    # (its run fails it, with the handler's own error; its message is built all the same)
    data = {"args": args, "kwargs": kwargs}
    jobs = [Job("c0", "test.celery_retry", "q1", {"args": [1], "kwargs": {}})]
    jobs.append(Job("c1", "test.celery_retry", "q1", data))
    made = messages_for(jobs, {}, None, {})
    assert [m.headers["kwargsrepr"] for m in made][1] == repr(data)
    assert [written(m) for m in made] == [written(m) for m in one_by_one(jobs, {}, None)]

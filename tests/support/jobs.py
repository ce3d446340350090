"""Handlers that exist only in the test worker (loaded with ``celery worker -I``)."""

from __future__ import annotations

import time
from typing import Literal

from celery import Task, shared_task
from celery.exceptions import Reject
from pydantic import BaseModel, ConfigDict, Field

from tasks.jobs import Defer, JobContext, KeelTask, RateLimited, UnrecoverableError, handler
from tasks.jobs.model.key_limits import KeyConcurrency, KeyRate
from tasks.jobs.model.options import Backoff, JobOptions


class PlainFailure(Exception):
    """An ordinary, retryable error."""


@handler("test.always_fails", queue="default")
def always_fails(job: JobContext) -> None:
    raise PlainFailure(f"plain failure on run {job.attempts_started}")


@handler("test.unrecoverable", queue="default")
def unrecoverable(job: JobContext) -> None:
    raise UnrecoverableError("this input can never succeed")


@handler("test.echo", queue="default", schedulable="tenant", submittable=True)
def echo(job: JobContext) -> dict:
    return {"echo": job.data}


@handler("test.sleep", queue="default")
def sleep(job: JobContext) -> dict:
    """Hold a worker process for ``data["ms"]`` milliseconds (concurrency tests)."""
    time.sleep(job.data.get("ms", 0) / 1000)
    return {"slept": job.data.get("ms", 0)}


@handler("test.hold", queue="default")
def hold(job: JobContext) -> dict:
    """Hold a worker process until the file ``data["until"]`` exists (at most ``data["maxMs"]``).

    Lets a chaos test keep a worker connected but busy, so that jobs added
    meanwhile wait in the broker instead of being taken at once.
    """
    from pathlib import Path

    deadline = time.monotonic() + job.data.get("maxMs", 60_000) / 1000
    until = Path(job.data["until"])
    while not until.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"released": until.exists()}


@handler("test.db_error", queue="default")
def db_error(job: JobContext) -> None:
    """Fail inside the database, the way an oversized value would (the SQL must not leak)."""
    from sqlalchemy import text

    from tasks.platform.db import transaction

    with transaction() as session:
        session.execute(text("SELECT CAST(:v AS varchar(3))::int"), {"v": "secret-value-xyz"})


@handler("test.outlast", queue="default")
def outlast(job: JobContext) -> dict:
    """First run: hold a transaction on its record until released (a re-run returns at once).

    Stands for a worker cut off the network in the middle of a transaction on
    a job: the server keeps the transaction open (nothing tells it the client
    is gone) and the record locked (``FOR KEY SHARE``, as an insert referencing
    it would: the run's own lock renewals still pass, a requeue or a claim does
    not). The run says nothing to Postgres or Redis until the file
    ``$KEEL_HOME/<job id>.release`` appears on its own host (at most
    ``data["maxMs"]``), so a test releases it once the cut is over: its result
    then arrives late, after another worker took the job over. It logs when
    it wakes, so the test can see that the late result was offered.
    """
    import logging

    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from tasks.platform.config import get_settings
    from tasks.platform.db import transaction

    if job.attempts_started == 1:
        release = get_settings().home / f"{job.id}.release"
        deadline = time.monotonic() + job.data["maxMs"] / 1000
        try:
            with transaction() as session:
                session.execute(
                    text("SELECT id FROM jobs WHERE id = :id FOR KEY SHARE"), {"id": job.id}
                )
                while not release.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
        except DBAPIError:  # the database ended the abandoned transaction meanwhile
            pass
        logging.getLogger(__name__).warning("test.outlast %s: first run woke up", job.id)
    return {"attempt": job.attempts_started}


# Celery-style Keel tasks: declared the way a Celery project declares its tasks.


class FlakyIO(IOError):
    """An error Celery's ``autoretry_for`` names."""


@shared_task(bind=True, base=KeelTask, name="test.celery_retry", max_retries=2)
def celery_retry(self, succeed_on_retry: int, label: str = "") -> dict:
    """``self.retry(countdown=0.3)`` until ``request.retries`` reaches ``succeed_on_retry``."""
    if self.request.retries < succeed_on_retry:
        raise self.retry(exc=PlainFailure(f"run {self.request.retries + 1}"), countdown=0.3)
    return {"retries": self.request.retries, "label": label}


@shared_task(
    bind=True,
    base=KeelTask,
    name="test.celery_autoretry",
    autoretry_for=(FlakyIO,),
    dont_autoretry_for=(FileNotFoundError,),
    retry_backoff=True,
    retry_jitter=False,
    max_retries=3,
)
def celery_autoretry(self, fail_times: int, missing: bool = False) -> dict:
    """Fails ``fail_times`` runs with an autoretried error (``missing``: one that is not)."""
    if missing:
        raise FileNotFoundError("no such input")
    if self.request.retries < fail_times:
        raise FlakyIO(f"flaky run {self.request.retries + 1}")
    return {"retries": self.request.retries}


@shared_task(bind=True, base=KeelTask, name="test.celery_reject")
def celery_reject(self) -> None:
    raise Reject("this input can never succeed", requeue=False)


@shared_task(bind=True, base=KeelTask, name="test.celery_requeue", max_retries=2)
def celery_requeue(self) -> None:
    raise Reject("not now", requeue=True)


@shared_task(bind=True, base=KeelTask, name="test.celery_retry_nothrow", max_retries=3)
def celery_retry_nothrow(self, times: int) -> dict:
    """Asks for a retry with ``throw=False`` on its first ``times`` runs, and returns anyway."""
    if self.request.retries < times:
        self.retry(countdown=0.1, throw=False)
        return {"discarded": self.request.retries}
    return {"retries": self.request.retries}


@shared_task(base=KeelTask, name="test.celery_add")
def celery_add(x: int, y: int = 0) -> int:
    """Adds: a chain's step (the previous step's result is its first argument)."""
    return x + y


@shared_task(base=KeelTask, name="test.celery_collect")
def celery_collect(results: list) -> dict:
    """A chord's body: what its parts returned, in order."""
    return {"results": results, "total": sum(r if isinstance(r, int) else 0 for r in results)}


@shared_task(bind=True, base=KeelTask, name="test.celery_part", max_retries=3)
def celery_part(self, index: int, label: str, fail_first: bool = False, ms: int = 0) -> dict:
    """A chord part: naps ``ms``, fails its first run when ``fail_first`` (``self.retry``)."""
    time.sleep(ms / 1000)
    if fail_first and self.request.retries == 0:
        raise self.retry(exc=PlainFailure(f"part {index} first run"), countdown=0.3)
    return {"index": index, "label": label}


BEAT_TICKS_KEY = "keel:test:beat-ticks"


@shared_task(name="test.beat_tick", base=Task)  # plain, whatever the app's default
def beat_tick() -> None:
    """A plain Celery task (no job record): notes each run's task id in Redis, so a test can
    count how many times a ``beat_schedule`` entry fired it."""
    from tasks.platform.broker import redis_client

    redis_client().rpush(BEAT_TICKS_KEY, beat_tick.request.id)


@shared_task(base=KeelTask, name="test.celery_now")
def celery_now() -> object:
    """Returns a datetime, as Celery tasks often do (Celery's JSON serializer takes it)."""
    from datetime import UTC, datetime

    return datetime.now(UTC)


@shared_task(
    bind=True,
    base=KeelTask,
    name="test.celery_autoretry_all",
    autoretry_for=(Exception,),
    max_retries=3,
    default_retry_delay=0,
)
def celery_autoretry_all(self) -> None:
    """``autoretry_for=(Exception,)``, a common Celery idiom, raising UnrecoverableError."""
    raise UnrecoverableError("this input can never succeed")


@shared_task(bind=True, base=KeelTask, name="test.celery_retry_args", max_retries=1)
def celery_retry_args(self, n: int, label: str = "") -> dict:
    """First run: ``self.retry(args=(n + 1,))``, Celery's way to run again with new args."""
    if self.request.retries == 0:
        raise self.retry(args=(n + 1, label), countdown=0.1)
    return {"n": n, "label": label}


@shared_task(base=KeelTask, name="test.celery_spawn")
def celery_spawn(x: int) -> dict:
    """Sends ``celery_add`` the Celery way from inside a running job; returns its id."""
    return {"child": celery_add.delay(x, 1).id}


@shared_task(base=KeelTask, name="test.celery_spawn_later")
def celery_spawn_later(x: int, countdown: float, tenant: str | None = None) -> dict:
    """Sends ``celery_add`` with a countdown from inside a running job, as ``tenant`` (its
    own ``acting_as``) if given; returns its id."""
    from tasks.jobs import Owner, acting_as

    if tenant is None:
        return {"child": celery_add.apply_async(args=(x, 1), countdown=countdown).id}
    with acting_as(Owner(tenant, "sender")):
        return {"child": celery_add.apply_async(args=(x, 1), countdown=countdown).id}


@shared_task(bind=True, base=KeelTask, name="test.celery_headers", max_retries=1)
def celery_headers(self, fail_first: bool = False) -> dict:
    """What a run sees of its call's ``headers=``; ``fail_first``: on its retry too."""
    if fail_first and self.request.retries == 0:
        raise self.retry(countdown=0.1)
    return {
        "headers": self.request.headers,
        "trace_hint": getattr(self.request, "trace_hint", None),
        "retries": self.request.retries,
    }


@handler("test.chain_of_three", queue="default", submittable=True)
def chain_of_three(job: JobContext) -> dict:
    """Sends a chain from inside a running job (a tenant may submit it: ``POST
    /api/v1/jobs``): two ``celery_add`` steps, then a ``celery_retry`` that retries once
    (through the delayed set, so a promoter publishes its second run). Returns the steps'
    ids."""
    from celery import chain

    sent = chain(celery_add.s(1, 2), celery_add.s(3), celery_retry.si(1, "last")).delay()
    return {"steps": [sent.parent.parent.id, sent.parent.id, sent.id]}


@handler("test.pausable", queue="pausable", submittable=True)
def pausable(job: JobContext) -> dict:
    """Echoes its data, on a queue of its own (the pause tests pause it whole)."""
    return {"echo": job.data, "tenant": job.tenant_id}


@handler("test.logs", queue="default", submittable=True)
def logs(job: JobContext) -> dict:
    """Writes ``lines`` lines to its log (``job.log()``); fails its first run if ``failFirst``."""
    numbers = [job.log(f"line {n} of run {job.attempts_started}") for n in range(job.data["lines"])]
    if job.data.get("failFirst") and job.attempts_started == 1:
        raise RuntimeError("first run fails after logging")
    return {"last": numbers[-1] if numbers else None}


@shared_task(bind=True, base=KeelTask, name="test.celery_logs", submittable=True)
def celery_logs(self, text: str) -> int:
    """A Celery-style task writing its log with ``self.log()``."""
    self.log(f"started with {text}")
    return self.log("done")


@shared_task(bind=True, base=KeelTask, name="test.soft_limited", soft_time_limit=1)
def soft_limited(self, seconds: float) -> dict:
    """Sleeps ``seconds`` unless Celery's soft time limit (1 s) interrupts it first."""
    from celery.exceptions import SoftTimeLimitExceeded

    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(0.05)
    except SoftTimeLimitExceeded:
        self.log("soft time limit: stopping cleanly")
        return {"interrupted": True, "after": round(time.monotonic() - started, 1)}
    return {"interrupted": False}


@shared_task(bind=True, base=KeelTask, name="test.nap", max_retries=1)
def nap(self, seconds: float, retry_first: bool = False) -> dict:
    """Sleeps ``seconds`` unless a soft time limit given by the call interrupts it (this task
    declares none); ``retry_first``: the first run asks for a retry at once."""
    from celery.exceptions import SoftTimeLimitExceeded

    if retry_first and self.request.retries == 0:
        raise self.retry(countdown=0.1)
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(0.05)
    except SoftTimeLimitExceeded:
        return {"interrupted": True, "after": round(time.monotonic() - started, 1)}
    return {"interrupted": False}


ERRBACKS_KEY = "keel:test:errbacks"


@shared_task(name="test.note_errback", base=Task)  # plain: Celery calls it with the task id
def note_errback(task_id: str) -> None:
    """A ``link_error`` errback: notes the id of each failed task it is called for in Redis."""
    from tasks.platform.broker import redis_client

    redis_client().rpush(ERRBACKS_KEY, task_id)


def errbacks_for(job_id: str) -> list[str]:
    """The calls ``note_errback`` noted for ``job_id`` (one entry per call)."""
    from tasks.platform.broker import redis_client

    calls = redis_client().lrange(ERRBACKS_KEY, 0, -1)
    return [called.decode() for called in calls if called.decode() == job_id]


def _two_attempts(_data: dict, _owner: object) -> JobOptions:
    return JobOptions(attempts=2, backoff=Backoff(type="fixed", delay=500))


@handler("test.hang", queue="default", timeout=2, options=_two_attempts)
def hang(job: JobContext) -> dict:
    """Sleeps 30 s, past its job type's ``timeout`` of 2 s; two attempts, 0.5 s apart."""
    time.sleep(30)
    return {"slept": 30}


@handler("test.cooperative", queue="default", submittable=True)
def cooperative(job: JobContext) -> dict:
    """Works in 0.1 s steps for up to ``seconds`` (default 30), checking ``job.is_aborted()``
    between steps; an abort makes it stop and return, noting so in its log."""
    started = time.monotonic()
    while time.monotonic() - started < job.data.get("seconds", 30):
        if job.is_aborted():
            job.log("aborted: stopping cleanly")
            return {"stopped": True}
        time.sleep(0.1)
    return {"stopped": False}


@shared_task(bind=True, base=KeelTask, name="test.celery_cooperative", submittable=True)
def celery_cooperative(self, seconds: float = 30) -> dict:
    """``test.cooperative`` as a bound Celery task: ``self.is_aborted()`` between steps."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if self.is_aborted():
            self.log("aborted: stopping cleanly")
            return {"stopped": True}
        time.sleep(0.1)
    return {"stopped": False}


BROKEN_KEY = "keel:test:broken:{}"


@handler("test.fixable", queue="default")
def fixable(job: JobContext) -> dict:
    """Fails while ``BROKEN_KEY`` of its ``key`` is set in Redis (a provider down), then works:
    what a bulk retry after the fix runs again."""
    from tasks.platform.broker import redis_client

    if redis_client().exists(BROKEN_KEY.format(job.data["key"])):
        raise PlainFailure("provider down")
    return {"fixed": True}


# --- limits by key (tests/integration/test_key_limits.py) -----------------------------------


def _run_unless_aborted(job: JobContext) -> dict:
    """Run ``data["ms"]`` milliseconds, stopping early if the job is aborted."""
    deadline = time.monotonic() + job.data.get("ms", 0) / 1000
    while time.monotonic() < deadline:
        if job.is_aborted():
            return {"stopped": True}
        time.sleep(0.02)
    return {"ran": job.data.get("ms", 0)}


@handler("test.keyed", queue="default", key_concurrency=KeyConcurrency("customer"))
def keyed(job: JobContext) -> dict:
    """One job per ``customer`` at a time; ``ms`` long."""
    time.sleep(job.data.get("ms", 0) / 1000)
    return {"customer": job.data.get("customer")}


@handler(
    "test.keyed_latest",
    queue="default",
    key_concurrency=KeyConcurrency("repo", strategy="cancel_in_progress"),
)
def keyed_latest(job: JobContext) -> dict:
    """One deploy per ``repo``, the newest wins."""
    return _run_unless_aborted(job)


@handler(
    "test.keyed_first",
    queue="default",
    key_concurrency=KeyConcurrency("repo", strategy="cancel_newest"),
)
def keyed_first(job: JobContext) -> dict:
    """One job per ``repo``, the first wins."""
    return _run_unless_aborted(job)


@handler(
    "test.keyed3",
    queue="default",
    key_concurrency=KeyConcurrency("partner", max_running=3),
    key_rate=KeyRate("partner", max=1000, per="1s"),
)
def keyed3(job: JobContext) -> dict:
    """Three jobs per ``partner`` at a time (overridden live in
    tests/integration/test_live_key_limits.py); ``ms`` long."""
    time.sleep(job.data.get("ms", 0) / 1000)
    return {"partner": job.data.get("partner")}


@handler("test.keyed_rated", queue="default", key_rate=KeyRate("apiKey", max=5, per="1s"))
def keyed_rated(job: JobContext) -> dict:
    """At most 5 starts a second per ``apiKey``."""
    return {"apiKey": job.data.get("apiKey")}


# --- parents and children (tests/integration/test_parent_wakeup.py) ---------------------------


@handler("test.fan_out", queue="default")
def fan_out(job: JobContext) -> dict:
    """First run: add ``data["children"]`` children (``test.echo``, or ``data["child"]``) and
    wait for them (a 60 s backstop; ``deferLate``: only once they have all ended); then:
    count how they ended."""
    children = job.children()
    if not children:
        for n in range(job.data["children"]):
            job.add_child(job.data.get("child", "test.echo"), {"n": n}, queue=job.queue)
        deadline = time.monotonic() + 20
        while job.data.get("deferLate") and time.monotonic() < deadline:  # they all end first
            if all(c["state"] in ("completed", "failed") for c in job.children()):
                break
            time.sleep(0.05)
        raise Defer(60_000, "waiting for its children", waiting_children=True)
    states = [child["state"] for child in children]
    return {"completed": states.count("completed"), "failed": states.count("failed")}


@handler("test.throttled", queue="default", key_rate=KeyRate("apiKey", max=100, per="1s"))
def throttled(job: JobContext) -> dict:
    """Its service says "too many requests" at its first run when ``data["throttle"]`` (for
    ``data["ms"]``, for its key or its ``data["scope"]``)."""
    if job.data.get("throttle") and job.attempts_started == 1:
        raise RateLimited(
            job.data.get("ms", 1500), "429 from the service", scope=job.data.get("scope", "key")
        )
    return {"apiKey": job.data.get("apiKey")}


@shared_task(
    bind=True,
    base=KeelTask,
    name="test.celery_keyed",
    key_concurrency=KeyConcurrency("customer_id"),
)
def celery_keyed(self, customer_id: str, ms: int = 0) -> str:
    """A Celery task limited to one run per ``customer_id`` at a time."""
    time.sleep(ms / 1000)
    return customer_id


# --- waiting for other jobs (tests/integration/test_job_waits.py) -------------------------------


@handler("test.await_jobs", queue="default")
def await_jobs(job: JobContext) -> dict:
    """Wait for the jobs ``data["jobs"]`` while one of them is unfinished (a 60 s backstop),
    or on its first run if ``data["deferFirst"]``; then: how they ended."""
    from tasks.jobs.observe.queries import get

    found = [get(job_id) for job_id in job.data["jobs"]]
    states = [record.state if record is not None else None for record in found]
    first = job.attempts_started == 1 and job.data.get("deferFirst")
    if first or any(state not in ("completed", "failed", "cancelled", None) for state in states):
        raise Defer(60_000, "waiting for other jobs", waiting_for=job.data["jobs"])
    return {"states": states}


@shared_task(base=KeelTask, name="test.celery_got")
def celery_got(*args: object, **kwargs: object) -> dict:
    """A chain's step that returns what it was called with."""
    return {"args": list(args), "kwargs": kwargs}


@handler("test.await_then_children", queue="default")
def await_then_children(job: JobContext) -> dict:
    """Wait for ``data["job"]`` with a short backstop, which wakes it while that job still
    runs; then add a child and wait for it (a 60 s backstop); then end."""
    if job.attempts_started == 1:
        raise Defer(300, "waiting for a job", waiting_for=[job.data["job"]])
    if not job.children():
        job.add_child("test.echo", {}, queue=job.queue)
        raise Defer(60_000, "waiting for its child", waiting_children=True)
    return {"runs": job.attempts_started}


@shared_task(name="test.rate_limited", rate_limit="600/m")
def rate_limited() -> str:
    """A task with Celery's own ``rate_limit``: its messages wait in a worker for a token."""
    return "ran"


class FormFields(BaseModel):
    """The data of ``test.form_fields``: a property of each kind the add-job form draws."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=2, max_length=40, description="what the job is called")
    copies: int = Field(ge=1, le=5)
    ratio: float = 0.5
    urgent: bool = False
    color: Literal["red", "green", "blue"] = "green"
    tags: list[str] = Field(default_factory=list)


@handler("test.form_fields", queue="default", submittable=True, data=FormFields)
def form_fields(job: JobContext) -> dict:
    """A type tenants may submit with a data model (the dashboard's add-job form draws it)."""
    return {"got": job.data}

"""Queue events in a bounded Redis stream per queue, readable from any process.

Names and fields follow BullMQ's QueueEvents: ``waiting, active, progress,
completed, failed, retrying, delayed, deduplicated, stalled``, plus
``cancelled`` (a job cancelled or revoked before it ran, ``tasks.jobs.end.cancel``, or whose
run was aborted), ``aborting`` (an active job's run asked to stop, ``tasks.jobs.end.abort``) and
``dead-lettered`` (an unreadable broker item set aside, ``tasks.platform.transport``). Emitting is
best effort: a job never fails because its event could not be written, and
while Redis is unreachable (``tasks.platform.broker``) events are dropped at once
rather than each waiting for a timeout.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import orjson

from tasks.jobs.observe import metrics
from tasks.platform import broker
from tasks.platform.broker import redis_client
from tasks.platform.holding import Held

log = logging.getLogger(__name__)
STREAM_MAXLEN = 10_000
EVENT_NAMES = (
    "waiting",
    "active",
    "progress",
    "completed",
    "failed",
    "retrying",
    "delayed",
    "deduplicated",
    "stalled",
    "cancelled",
    "aborting",
    "dead-lettered",
)


# The events that end a job: each also tells a waiting ``AsyncResult.get()`` to read the
# record again (``tasks.jobs.observe.results``), on Celery's channel for the job's result;
# a success only when a caller marked the job watched (``Event(news=)``).
ENDING_EVENTS = frozenset({"completed", "failed", "cancelled"})
RESULT_CHANNEL_PREFIX = "celery-task-meta-"  # Celery's Redis backend's key for a result
# Not the result itself (another tenant may listen on a guessed id): only the news that the
# record changed; a waiting reader reads the record, scoped to its owner.
ENDED = "KEEL-ENDED"


class AJob(Protocol):
    """What an event says of its job: a record, a claimed run or a running job's context."""

    @property
    def queue(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def tenant_id(self) -> str | None: ...


def stream_key(queue: str) -> str:
    return f"keel:events:{queue}"


def result_channel(job_id: str) -> str:
    return f"{RESULT_CHANNEL_PREFIX}{job_id}"


def emit_many(entries: Sequence[tuple[str, str, str, str | None, str | None]]) -> None:
    """``(queue, event, job id, name, tenant)`` of many jobs, in one round trip (a bulk
    add's)."""
    if entries:
        batch = (
            Event(queue, event, job, name, tenant=tenant)
            for queue, event, job, name, tenant in entries
        )
        _send([*_held.take(), *batch])


class Event:
    """One event: its stream entry (and, for an ending event, the news on its result's
    channel), and what it counts: its counter and (``observed``: a ``(kind, seconds)``
    histogram observation, ``tasks.jobs.observe.metrics``) what the transition measured.
    ``emit`` sends it; a publish can take it along (``tasks.platform.transport``)."""

    __slots__ = ("counted", "entry", "event", "job_id", "name", "news", "observed", "queue")

    def __init__(
        self,
        queue: str,
        event: str,
        job_id: str,
        name: str | None = None,
        *,
        tenant: str | None = None,
        observed: tuple[str, float] | None = None,
        news: bool | None = None,
        **fields: Any,
    ) -> None:
        # Typed loosely: redis-py's stubs want invariant dicts of their own unions.
        entry: dict[Any, Any] = {
            "event": event,
            "jobId": job_id,
            "queue": queue,
            "time": f"{time.time():.3f}",
        }
        if name:
            entry["name"] = name
        if tenant:  # whose: a tenant's stream of every job (``read_tenant``) keeps its own
            entry["tenant"] = tenant
        for key, value in fields.items():
            entry[key] = value if isinstance(value, str) else json.dumps(value, default=str)
        self.queue, self.event, self.job_id, self.name = queue, event, job_id, name
        self.entry, self.observed, self.counted = entry, observed, False
        # An ending event tells the job's result channel, unless its sender knows nobody
        # waits (``news=False``: a success no caller marked, ``tasks.jobs.end.finish``).
        self.news = event in ENDING_EVENTS and news is not False

    @classmethod
    def of(
        cls,
        job: AJob,
        event: str,
        *,
        observed: tuple[str, float] | None = None,
        news: bool | None = None,
        **fields: Any,
    ) -> Event:
        """``job``'s event: its queue, id, name and tenant taken from it."""
        return cls(
            job.queue,
            event,
            job.id,
            job.name,
            tenant=job.tenant_id,
            observed=observed,
            news=news,
            **fields,
        )

    def add_to(self, pipe: Any) -> None:
        """Its commands; its counts go to the process's tally, once, whichever pipeline
        takes it (one that failed is sent again by the caller)."""
        pipe.xadd(stream_key(self.queue), self.entry, maxlen=STREAM_MAXLEN, approximate=True)
        if self.news:  # the news only: a reader reads the record, scoped
            pipe.publish(result_channel(self.job_id), _ended_news(self.job_id))
        self.count()

    def count(self) -> None:
        """Its counter and observation, into this process's tally; once."""
        if not self.counted:
            self.counted = True
            metrics.count_event(self.queue, self.event, job_name=self.name)
            if self.observed is not None:
                metrics.observe(self.queue, *self.observed, job_name=self.name)

    def send(self) -> None:
        """In one round trip, after whatever this process holds back (``later``)."""
        _send([*_held.take(), self])


def _ended_news(job_id: str) -> str:
    return json.dumps({"task_id": job_id, "status": ENDED})


def _send(batch: list[Event]) -> None:
    if not batch:
        return
    last = batch[-1]
    if broker.unreachable():  # the counts wait in the tally (tasks.platform.tallies)
        log.info("Redis unreachable: %d events up to %s dropped", len(batch), last.event)
        for event in batch:
            event.count()
        return
    started = time.monotonic()
    try:
        pipe = redis_client().pipeline(transaction=False)
        if len(batch) < MANY:
            for event in batch:
                event.add_to(pipe)
        else:
            for at in range(0, len(batch), MANY_MAX):
                _add_many(pipe, batch[at : at + MANY_MAX])
        pipe.execute()
    except broker.UNREACHABLE_ERRORS as exc:
        broker.failed(exc, started)
        log.warning("could not emit %s for job %s: %s", last.event, last.job_id, exc)
    except Exception:
        log.warning("could not emit %s for job %s", last.event, last.job_id, exc_info=True)


#: From this many events on, a batch goes as one script (``_ADD_MANY``), at most ``MANY_MAX``
#: a call: redis-py builds and reads one XADD a few times slower than the script runs it.
MANY = 16
MANY_MAX = 1000
# KEYS: the streams. ARGV[1]: their MAXLEN; ARGV[2]: a JSON list of events, each
# [stream's index in KEYS, channel of the news of its end or "", that news, field, value,
# ...]: what ``Event.add_to`` sends, in the order given.
# Each command on its own (``pcall``), as in a pipeline: one that fails (a key of another
# type) costs its own event, not those after it. Returns how many failed.
_ADD_MANY = """
local events = cjson.decode(ARGV[2])
local failed = 0
for _, e in ipairs(events) do
  local added = redis.pcall('XADD', KEYS[e[1]], 'MAXLEN', '~', ARGV[1], '*', unpack(e, 4))
  if type(added) == 'table' and added.err then failed = failed + 1 end
  if e[2] ~= '' then redis.pcall('PUBLISH', e[2], e[3]) end
end
return failed
"""


def _add_many(pipe: Any, batch: list[Event]) -> None:
    """``Event.add_to`` for each of ``batch``, as one script call; their counts summed."""
    streams: dict[str, int] = {}
    rows: list[list[Any]] = []
    for event in batch:
        key = stream_key(event.queue)
        index = streams.setdefault(key, len(streams) + 1)
        row: list[Any] = [
            index,
            result_channel(event.job_id) if event.news else "",
            _ended_news(event.job_id) if event.news else "",
        ]
        for field, value in event.entry.items():
            row += (field, value)
        rows.append(row)
    pipe.eval(_ADD_MANY, len(streams), *streams, STREAM_MAXLEN, orjson.dumps(rows))  # text
    counts: dict[tuple[str, str, str | None], int] = {}  # once in the pipeline: as ``count``
    for event in batch:
        if not event.counted:
            event.counted = True
            counted = (event.queue, event.event, event.name)
            counts[counted] = counts.get(counted, 0) + 1
            if event.observed is not None:
                metrics.observe(event.queue, *event.observed, job_name=event.name)
    for (queue, name, job_name), n in counts.items():
        metrics.count_event(queue, name, n, job_name=job_name)


#: How long an event may be held back (``later``) before it goes out on its own.
HOLD_S = 0.05


_held: Held[Event] = Held(lambda batch: _send(batch), lambda: HOLD_S, "keel-events")


def later(event: Event) -> None:
    """Send ``event`` with this process's next event, or on its own within twice ``HOLD_S``.

    A job's ``active`` goes out with its ``completed`` when the run is short (one
    round trip instead of two), and on its own while a longer run goes on. Order is
    kept: every event sent from this process goes after those held before it.
    """
    _held.add(event)


def emit(
    queue: str,
    event: str,
    job_id: str,
    name: str | None = None,
    *,
    tenant: str | None = None,
    observed: tuple[str, float] | None = None,
    **fields: Any,
) -> None:
    """One event (``Event``), in one round trip."""
    Event(queue, event, job_id, name, tenant=tenant, observed=observed, **fields).send()


def emit_job(
    job: AJob,
    event: str,
    *,
    observed: tuple[str, float] | None = None,
    news: bool | None = None,
    **fields: Any,
) -> None:
    """``job``'s event (``Event.of``), in one round trip."""
    Event.of(job, event, observed=observed, news=news, **fields).send()


def _decode(fields: dict[bytes, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in fields.items():
        value = raw.decode()
        k = key.decode()
        if k in ("event", "jobId", "queue", "name", "time", "tenant"):
            out[k] = value
            continue
        try:
            out[k] = json.loads(value)
        except ValueError:
            out[k] = value
    return out


def read(
    queues: list[str], *, since: str = "0", follow: bool = False, block_ms: int = 250
) -> Iterator[dict[str, Any]]:
    """Events of ``queues`` after id ``since`` (``$``: new ones only); forever if ``follow``.

    ``block_ms`` stays under the client's socket timeout (``tasks.platform.broker``):
    a blocking read that outlasts it would look like a hung Redis.
    """
    cursors: dict[Any, Any] = {stream_key(q): since for q in queues}
    client = redis_client()
    while True:
        batch: Any = client.xread(cursors, block=block_ms if follow else None, count=500)
        if not batch and not follow:
            return
        for stream, entries in batch or []:
            for entry_id, fields in entries:
                cursors[stream.decode()] = entry_id.decode()
                yield {"id": entry_id.decode(), **_decode(fields)}
        if not follow and batch and all(len(e) < 500 for _, e in batch):
            return


def latest_ids(queues: list[str]) -> dict[str, str]:
    """Each queue's last event id now (``0-0``: none yet): where a reader of new events
    only starts (``$``, in one round trip, for a reader that polls)."""
    pipe = redis_client().pipeline(transaction=False)
    for queue in queues:
        pipe.xrevrange(stream_key(queue), count=1)
    return {
        queue: found[0][0].decode() if found else "0-0"
        for queue, found in zip(queues, pipe.execute(), strict=True)
    }


def read_after(cursors: dict[str, str], count: int = 500) -> list[tuple[str, dict[str, Any]]]:
    """``(queue, event)`` after each queue's cursor (``{queue: id}``), up to ``count`` a
    queue, in one round trip; oldest first across the queues."""
    batch: Any = redis_client().xread({stream_key(q): at for q, at in cursors.items()}, count=count)
    prefix = len(stream_key(""))
    found = [
        (stream.decode()[prefix:], {"id": entry_id.decode(), **_decode(fields)})
        for stream, entries in batch or []
        for entry_id, fields in entries
    ]
    found.sort(key=lambda pair: tuple(int(part) for part in pair[1]["id"].split("-")))
    return found


DEAD_LETTERED = "dead-lettered"


def dead_letter_event(sender: Any, job_id: str, name: str | None = None, **kwargs: Any) -> None:
    """A broker item set aside as a dead letter, on its queue's stream (a receiver of
    ``tasks.platform.deadletters.dead_lettered``, connected by the app's assembly)."""
    emit(
        sender.queue,
        DEAD_LETTERED,
        job_id,
        name,
        deadLetterId=sender.id,
        reason=sender.reason,
        source=sender.source,
    )

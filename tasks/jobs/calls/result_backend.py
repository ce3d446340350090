"""Keel's Celery result backend: ``AsyncResult`` reads the job record.

Configured as ``tasks.jobs.calls.result_backend:KeelBackend+redis://…``
(``tasks.celeryconfig``). It is Celery's Redis backend, with three differences:

- **Results come from the records.** ``AsyncResult(id).state``, ``.result``,
  ``.traceback``, ``.ready()`` and the rest read the job's record
  (``tasks.jobs.observe.results``: the state mapping, owner scope, exceptions); an id
  with no record (a plain Celery task's, ``base=celery.Task``) is Celery's own result
  in Redis, as before. Keel's messages ask Celery to store nothing
  (``ignore_result``): the record is the only copy.
- **``.get()`` waits on the job's end, not on a poll.** When a job ends, the worker
  publishes the news on Celery's channel for that result
  (``tasks.jobs.observe.events``); Celery's result consumer, subscribed to it, reads the
  record once. A success is told only when a caller waits on it: a wait's first read of
  its jobs marks them watched in the same statement (``results.read(watch=True)``), and the
  completion's statement returns the mark; a success nobody waits on costs Redis no
  ``PUBLISH``. Should that news be lost (Redis restarted, the worker killed between its
  commit and its publish), every waiting ``.get()`` of this process re-reads its pending
  jobs in one statement every ``FALLBACK_POLL_S``: the wait is bounded, and 100 callers
  waiting on 100 jobs cost Postgres one statement per interval per thread.
- **Chords whose body is a Keel task are counted in the records** (``open_chord``,
  ``part_ended``: ``tasks.jobs.end.canvas``), not in Redis.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend, ResultConsumer, SentinelBackend
from celery.canvas import Signature

from tasks.jobs.end import ending
from tasks.jobs.end.canvas import body_id_of, is_keel_chord, keel_task, open_chord, part_ended
from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.observe import results
from tasks.jobs.observe.events import ENDED, RESULT_CHANNEL_PREFIX
from tasks.platform.db import transaction

FALLBACK_POLL_S = 5.0
# Set while a wait's first read runs (``KeelResultConsumer.on_wait_for_pending``).
_watching: ContextVar[bool] = ContextVar("keel_result_watching", default=False)


class KeelResultConsumer(ResultConsumer):
    """Celery's Redis result consumer; the news that a job ended makes it read the record."""

    def on_wait_for_pending(self, result: Any, **kwargs: Any) -> None:
        """Celery's first read of what a wait waits on (subscribed already), which also marks
        those records watched: the worker that completes one tells its channel."""
        token = _watching.set(True)
        try:
            super().on_wait_for_pending(result, **kwargs)
        finally:
            _watching.reset(token)

    def on_state_change(self, meta: dict[str, Any], message: Any) -> None:
        if meta.get("status") == ENDED:
            meta = self.backend.get_task_meta(meta["task_id"], cache=False)
            if meta["status"] not in states.READY_STATES:
                return  # not the caller's to read, or not ended after all (retried by hand)
        super().on_state_change(meta, message)


class KeelBackend(RedisBackend):
    """Celery's Redis result backend over Keel's job records (see the module)."""

    ResultConsumer = KeelResultConsumer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        prefix = self.task_keyprefix
        prefix = prefix.decode() if isinstance(prefix, bytes) else prefix
        if prefix != RESULT_CHANNEL_PREFIX:  # the worker publishes there
            raise ValueError(f"Keel's result backend needs the prefix {RESULT_CHANNEL_PREFIX}")

    # --- reading -----------------------------------------------------------------------

    def _get_task_meta_for(self, task_id: Any) -> dict[str, Any]:
        found = results.read([str(task_id)], watch=_watching.get()).get(str(task_id))
        if found is None:  # no record: a plain Celery task's result, in Redis
            stored: dict[str, Any] = super()._get_task_meta_for(task_id)
            return stored
        decoded: dict[str, Any] = self.meta_from_decoded(found)
        return decoded

    def mget(self, keys: list[Any]) -> list[Any]:
        """Celery's batched read (``GroupResult``, ``get_many``): records first, one statement."""
        ids = [self._strip_prefix(key) for key in keys]
        found = results.read((str(job_id) for job_id in ids), watch=_watching.get())
        rest = [key for key, job_id in zip(keys, ids, strict=True) if str(job_id) not in found]
        stored = dict(zip(rest, super().mget(rest), strict=True)) if rest else {}
        return [
            self.encode(found[str(job_id)]) if str(job_id) in found else stored.get(key)
            for key, job_id in zip(keys, ids, strict=True)
        ]

    def forget(self, task_id: Any) -> None:
        """``AsyncResult.forget()``: a job's stored result goes; its record and audit stay."""
        results.forget(str(task_id))
        super().forget(task_id)

    # --- waiting -----------------------------------------------------------------------

    def _wait_for_pending(
        self, result: Any, timeout: Any = None, on_interval: Any = None, **kwargs: Any
    ) -> Any:
        fallback = _FallbackPoll(self)

        def interval() -> None:
            fallback()
            if on_interval is not None:
                on_interval()

        return super()._wait_for_pending(result, timeout=timeout, on_interval=interval, **kwargs)

    # --- chords ------------------------------------------------------------------------

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> Any:
        _group_id, parts = header_result_args
        task = keel_task(body.task) if isinstance(body, Signature) else None
        simple = all(not getattr(part, "results", None) for part in parts)
        keel = task is not None and simple and bool((body.options or {}).get("task_id"))
        if keel and open_chord(task, body, [str(part.id) for part in parts]):
            return None
        return super().apply_chord(header_result_args, body, **kwargs)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        body_id = body_id_of({"chord": request.chord})
        if body_id is None or not is_keel_chord(body_id):
            super().on_chord_part_return(request, state, result, **kwargs)
            return
        if keel_task(request.task) is not None:
            return  # counted when its end was recorded (``completed``/``failed``)
        with transaction() as session:  # a plain Celery task in a Keel chord
            if state == states.FAILURE:
                ending.chord_part_failed(session, body_id, str(request.id), repr(result))
                return
            ready = part_ended(session, body_id, str(request.id), result)
            if ready:
                publish_ready(session, ready)


class KeelSentinelBackend(KeelBackend, SentinelBackend):
    """``KeelBackend`` on the primary Redis Sentinel names (``KEEL_REDIS_URL=sentinel://…``):
    configured as ``KeelSentinelBackend+sentinel://…`` with the primary's name in
    ``result_backend_transport_options`` (``tasks.celeryconfig``). Its clients' connections
    ask the sentinels for the primary, and again once it is lost; the result consumer's
    subscription is made again on the promoted replica by Celery's own reconnection."""


class _FallbackPoll:
    """Every ``FALLBACK_POLL_S`` of a wait: read this backend's pending jobs again, in one
    statement, and hand those that ended to the result consumer (as their news would)."""

    def __init__(self, backend: KeelBackend) -> None:
        self.backend = backend
        self.due = time.monotonic() + FALLBACK_POLL_S

    def __call__(self) -> None:
        if time.monotonic() < self.due:
            return
        self.due = time.monotonic() + FALLBACK_POLL_S
        concrete, weak = self.backend._pending_results
        pending = [*concrete, *weak]
        if not pending:
            return
        for meta in results.read(pending).values():
            if meta["status"] in states.READY_STATES:
                decoded = self.backend.meta_from_decoded(dict(meta))
                self.backend.result_consumer.on_state_change(decoded, None)

"""Celery's ``revoke`` keeps the records true: a revoked job is ``cancelled``, and never runs.

``app.control.revoke(job_id)`` tells every worker to discard the task's
message. Celery does that when the message reaches a worker, and says so with
``task_revoked`` (``tasks.jobs.calls.signals``): the job's record, still waiting, is
cancelled then (``revoked_message``). With ``terminate=True`` the running
child is killed, and the active record is cancelled too: its run cannot
record anything any more (its lock token is cleared), and it must not be
requeued as stalled.

A delayed job has no message until it is due, so nothing would reach a
worker for Celery to discard. Each worker's maintenance loop therefore reads
the worker's revoked set (``celery.worker.state.revoked``, filled by the
broadcast) and cancels the records of ids it has not handled yet that are
still waiting or delayed (``cancel_revoked``): a revoked delayed job is
cancelled within a tick, before it is due. Every worker receives the
broadcast and tries; the first to lock a record cancels it, the others find
it cancelled and do nothing. A worker that was not running when the revoke
was broadcast does not know of it — as in Celery, where revokes are held in
the workers' memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from celery.worker import state as worker_state

from tasks.jobs.end.cancel import cancel_many
from tasks.jobs.model.models import CANCELLABLE_STATES, State
from tasks.jobs.store.jobs import REVOKED

log = logging.getLogger(__name__)


# Discarded messages whose records could not be cancelled yet (the database was down):
# Celery has acknowledged the message, so nothing else would ever wake these jobs.
_unrecorded: dict[str, bool] = {}
_unrecorded_lock = threading.Lock()


def revoked_message(job_id: str, *, terminated: bool) -> list[str]:
    """A worker discarded ``job_id``'s message (or killed its run): cancel its record.

    If the records cannot be reached, the next maintenance tick tries again.
    """
    states = (*CANCELLABLE_STATES, State.ACTIVE) if terminated else CANCELLABLE_STATES
    try:
        return cancel_many([job_id], states, by=REVOKED)
    except Exception:
        with _unrecorded_lock:
            _unrecorded[job_id] = terminated or _unrecorded.get(job_id, False)
        raise


def _retry_unrecorded() -> None:
    with _unrecorded_lock:
        pending = dict(_unrecorded)
        _unrecorded.clear()
    for job_id, terminated in pending.items():
        try:
            revoked_message(job_id, terminated=terminated)
        except Exception as exc:  # kept again, for the next tick
            log.warning("revoked job %s not cancelled yet: %s", job_id, exc.__class__.__name__)


class RevokedWatch:
    """Cancels the records of newly revoked ids, remembering which ids it has handled."""

    def __init__(self) -> None:
        self._handled: frozenset[str] = frozenset()

    def check(self, revoked: Collection[str]) -> list[str]:
        """Cancel the waiting or delayed records of ids in ``revoked`` not handled before.

        Ids that lapse out of Celery's bounded set are forgotten here too; a
        failed cancel (the database is down) leaves its ids for the next check.
        """
        current = frozenset(revoked)
        fresh = current - self._handled
        cancelled = cancel_many(sorted(fresh), CANCELLABLE_STATES, by=REVOKED) if fresh else []
        self._handled = current
        if cancelled:
            log.info("revoked jobs cancelled: %s", ", ".join(cancelled))
        return cancelled


_WATCH = RevokedWatch()


def cancel_revoked() -> list[str]:
    """One maintenance tick: cancel the records of jobs this worker was told to revoke.

    Runs in the worker's main process, which holds the revoked set (and where
    ``task_revoked`` fires).
    """
    _retry_unrecorded()
    return _WATCH.check(worker_state.revoked.as_dict().keys())

"""The job layer's exceptions, in three families under one root, none of them HTTP's.

- ``Refused``: a caller asked for something Keel will not do (no such job, a
  state that forbids it, a conflict, a quota, a shape limit). Each has a
  ``code`` clients can branch on; how it answers over HTTP is the web
  layer's business (``web/errors.py``, one table).
- ``Unavailable``: a part Keel needs cannot be reached right now.
- ``ControlFlow``: not an error anyone is shown, but how a handler or the job
  layer says what happens next (``UnrecoverableError``, ``Defer``, a run that
  is no longer ours, a limit that holds a delivery). One reaching the API is
  a bug, answered as such (500).

The root (``KeelError``) and ``ControlFlow`` are infrastructure's too: they are
defined in ``tasks.platform.errors`` and are the same classes here.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasks.platform.errors import ControlFlow as ControlFlow
from tasks.platform.errors import KeelError as KeelError


class Refused(KeelError):
    """Keel refused what a caller asked; ``code`` names the refusal for clients."""

    code = "refused"


class Unavailable(KeelError):
    """A part Keel needs cannot be reached right now; try again shortly."""

    code = "unavailable"


class JobNotFound(Refused):
    """No such job."""

    code = "not_found"


class InvalidJobState(Refused):
    """The job is not in a state that allows this."""

    code = "invalid_state"


class JobConflict(Refused):
    """Another job or result already covers this operation."""

    code = "conflict"


class TemplateRefused(Refused):
    """A scheduler's job template asks for something its owner may not schedule."""

    code = "validation_failed"


class QuotaExceeded(Refused):
    """The tenant is at one of its quotas (``details`` name the limit)."""

    code = "quota_exceeded"


class LimitExceeded(Refused):
    """The request is bigger or further out than a tenant may ask for (a shape limit)."""

    code = "validation_failed"


class InvalidId(Refused):
    """An id outside its rule: one the API, the dashboard or the CLI could not name again."""

    code = "validation_failed"


class BrokerUnavailable(Unavailable):
    """The broker could not be reached."""

    code = "broker_unavailable"


class UnrecoverableError(ControlFlow):
    """Fail the job now, whatever attempts remain (BullMQ's ``UnrecoverableError``)."""

    code = "unrecoverable"


# At most this many jobs named by one ``Defer(waiting_for=...)``.
MAX_WAITING_FOR = 1000


class Defer(ControlFlow):
    """Run this job again after ``delay_ms`` without using up an attempt.

    BullMQ's ``moveToDelayed`` + ``DelayedError``. With ``waiting_children`` the job is
    parked as ``waiting-children`` until the children it added (``job.add_child``) have all
    ended; with ``waiting_for``, until the jobs it names (any job's id, shared by other
    waiters or not) have all ended; with both, until all of them have. The transaction that
    records the last end publishes it; ``delay_ms`` is a backstop.
    """

    code = "deferred"

    def __init__(
        self,
        delay_ms: int,
        reason: str = "deferred",
        *,
        waiting_children: bool = False,
        waiting_for: Sequence[str] = (),
    ) -> None:
        super().__init__(reason)
        if isinstance(waiting_for, str) or not all(
            isinstance(job_id, str) and job_id for job_id in waiting_for
        ):
            raise ValueError(f"waiting_for is a list of job ids, not {waiting_for!r}")
        if len(waiting_for) > MAX_WAITING_FOR:
            raise ValueError(f"a job waits for at most {MAX_WAITING_FOR} jobs at once")
        self.delay_ms = delay_ms
        self.waiting_children = waiting_children
        self.waiting_for = tuple(waiting_for)


class RateLimited(Defer):
    """The service the handler calls said "too many requests": run this job again after
    ``delay_ms`` without using an attempt, and hold the other jobs of its limiter until
    then (BullMQ's ``RateLimitError`` with ``worker.rateLimit(ms)``).

    ``scope="key"``: the job type's ``key_rate`` window of this job's key;
    ``scope="queue"``: the queue's rate window (``KEEL_QUEUE_LIMITS``). Where there is no
    such window, only this job waits.
    """

    code = "rate_limited"

    def __init__(self, delay_ms: int, reason: str = "rate limited", *, scope: str = "key") -> None:
        if scope not in ("key", "queue"):
            raise ValueError(f"a rate limit's scope is 'key' or 'queue', not {scope!r}")
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int | float):
            raise ValueError(f"a rate limit lasts 1 ms to a day, not {delay_ms!r} ms")
        if not 1 <= delay_ms <= 86_400_000:
            raise ValueError(f"a rate limit lasts 1 ms to a day, not {delay_ms!r} ms")
        super().__init__(int(delay_ms), reason)
        self.scope = scope


class JobFailed(Exception):
    """A job's failure as ``AsyncResult.get()`` raises it when the job ended without an
    exception of its own (stalled too often, a chord body whose part failed): its reason.

    Not a ``KeelError``: it is a job's outcome, never an answer of Keel's API."""

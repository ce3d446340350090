"""Record jobs in the caller's own transaction: ``in_transaction(session)``.

A Flask view that inserts an order and ``.delay()``s its confirmation wants both or
neither: the job must not run for an order that was rolled back, nor be lost for one that
committed. Inside ``with in_transaction(session):`` every job added on this thread
(``.delay()``, ``apply_async``, ``tasks.jobs.add``) is inserted by the caller's SQLAlchemy
``Session`` (Flask-SQLAlchemy's ``db.session`` is one), in its transaction, and its
message is published only once that transaction commits:

- **rollback** → no record, no message;
- **commit** → the jobs become waiting and are published at once, in one transaction of
  Keel's own after the caller's commit;
- **the process dies between the two** (killed, or the publish fails) → the jobs were
  recorded parked (delayed by ``BACKSTOP_S``) in the caller's transaction, so the
  promoter publishes them when that runs out: a committed job is never stranded, on
  Redis or RabbitMQ.

The session must be connected to Keel's database (``KEEL_DATABASE_URL``): a session of
another database is refused with ``ForeignDatabase`` before anything is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, scoped_session

from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.errors import Refused
from tasks.jobs.store import upkeep
from tasks.platform.config import get_settings, sqlalchemy_url
from tasks.platform.db import transaction

log = logging.getLogger(__name__)
# How long a job recorded in a caller's transaction waits for its publish after the
# commit before the promoter publishes it instead.
BACKSTOP_S = 5.0


class ForeignDatabase(Refused):
    """``in_transaction`` was given a session of another database than Keel's."""

    code = "foreign_database"


class NotInCallersTransaction(Refused):
    """A way of adding jobs that cannot record them in the caller's transaction (a bulk
    add): refused inside ``in_transaction`` rather than committed whatever the caller does."""

    code = "not_in_callers_transaction"


@dataclass
class CallerTransaction:
    """The caller's session, the jobs it recorded that wait for its commit, and what is
    announced only then (a job's event, a deduplication)."""

    session: Session
    parked: list[str] = field(default_factory=list)
    announcements: list[Callable[[], object]] = field(default_factory=list)
    _armed: bool = False
    _generation: int = 0

    def hold(self, job_id: str) -> None:
        """Park a job recorded waiting in this transaction until the caller commits."""
        upkeep.park(self.session, [job_id], BACKSTOP_S)
        self.parked.append(job_id)
        self._arm()

    def on_commit(self, announce: Callable[[], object]) -> None:
        """Call ``announce`` once the caller commits; never, if it rolls back."""
        self.announcements.append(announce)
        self._arm()

    def _arm(self) -> None:
        """Listen for this transaction's end, once (the first job of the transaction)."""
        if self._armed:
            return
        self._armed = True
        generation = self._generation
        event.listen(
            self.session, "after_commit", lambda _s: self._committed(generation), once=True
        )
        event.listen(
            self.session, "after_rollback", lambda _s: self._rolled_back(generation), once=True
        )

    def _ended(self, generation: int) -> tuple[list[str], list[Callable[[], object]]] | None:
        """What this transaction held, handed over once; None for a listener of a transaction
        that already ended the other way (SQLAlchemy keeps it registered until it fires)."""
        if generation != self._generation:
            return None
        self._generation += 1
        self._armed = False
        held, later = self.parked, self.announcements
        self.parked, self.announcements = [], []
        return held, later

    def _committed(self, generation: int) -> None:
        ended = self._ended(generation)
        if ended is None:
            return
        held, later = ended
        try:
            publish_now(held)
        except Exception:  # committed and parked: the promoter publishes them when due
            log.warning("could not publish %d committed jobs at once", len(held), exc_info=True)
        for announce in later:
            try:
                announce()
            except Exception:  # an event is news, never the truth: the record is
                log.warning("could not announce a committed job", exc_info=True)

    def _rolled_back(self, generation: int) -> None:
        # Their records went with the transaction: nothing to publish or announce.
        self._ended(generation)


_CALLER: ContextVar[CallerTransaction | None] = ContextVar("keel_caller_tx", default=None)


def current() -> CallerTransaction | None:
    """The caller's transaction jobs are recorded in here, if ``in_transaction`` is open."""
    return _CALLER.get()


def _where(url: Any) -> tuple[Any, ...]:
    parsed = make_url(sqlalchemy_url(str(url))) if isinstance(url, str) else url
    host = parsed.host or parsed.query.get("host")
    return (host, parsed.port or 5432, parsed.database)


def _check_database(session: Session) -> None:
    bind = session.get_bind()
    theirs = _where(bind.engine.url)
    ours = _where(get_settings().sqlalchemy_url)
    if theirs != ours:
        raise ForeignDatabase(
            f"in_transaction needs a session of Keel's database {ours[2]!r} on {ours[0]}:"
            f"{ours[1]}; this one is connected to {theirs[2]!r} on {theirs[0]}:{theirs[1]}"
        )


@contextmanager
def in_transaction(session: Session | scoped_session[Session]) -> Iterator[CallerTransaction]:
    """Record the jobs added in this block in ``session``'s transaction (see the module).

    The block does not commit: the caller does, as it would anyway. Blocks may nest; an
    inner one naming another session records there.
    """
    if isinstance(session, scoped_session):  # Flask-SQLAlchemy's ``db.session``
        session = session()
    if not isinstance(session, Session):
        raise TypeError(f"in_transaction takes a SQLAlchemy Session, not {type(session)!r}")
    _check_database(session)
    outer = _CALLER.get()
    tx = outer if outer is not None and outer.session is session else CallerTransaction(session)
    token = _CALLER.set(tx)
    try:
        yield tx
    finally:
        _CALLER.reset(token)


def publish_now(job_ids: list[str]) -> None:
    """Promote and publish jobs a caller's transaction just committed, in one transaction."""
    if not job_ids:
        return
    with transaction() as session:
        ready = upkeep.promote_now(session, job_ids)
        publish_ready(session, ready, announce_waiting=True)

"""Record jobs in the caller's own transaction: ``in_transaction(connection)``.

A view that inserts an order and ``.delay()``s its confirmation wants both or neither:
the job must not run for an order that was rolled back, nor be lost for one that
committed. Inside ``with in_transaction(connection):`` every job added on this thread
(``.delay()``, ``apply_async``, ``tasks.jobs.add``, a bulk add, a chord's body and parts)
is inserted on the caller's connection, in its transaction, and its message is published
only once that transaction commits:

- **rollback** → no record, no message;
- **commit** → the jobs become waiting and are published at once, in one transaction of
  Keel's own after the caller's commit;
- **the process dies between the two** (killed, or the publish fails) → the jobs were
  recorded parked (delayed by ``BACKSTOP_S``) in the caller's transaction, so the
  promoter publishes them when that runs out: a committed job is never stranded, on
  Redis or RabbitMQ.

The caller's connection may be any of these, on Keel's database (``KEEL_DATABASE_URL``;
another database's is refused with ``ForeignDatabase`` before anything is recorded, but
for Django's, below):

- a SQLAlchemy ``Session`` (Flask-SQLAlchemy's ``db.session``): published from its
  ``after_commit``;
- Django's connection (``django.db.connection``, psycopg 3), inside ``atomic()``:
  published from Django's ``on_commit``;
- a SQLAlchemy Core ``Connection`` or a plain psycopg ``Connection``, in a transaction:
  neither can tell its caller's process that it committed, so the transaction also sends
  a ``NOTIFY``, which Postgres delivers only once it commits, and every worker listens
  (``tasks.jobs.upkeep.committed``) and publishes the jobs at once. Their events are the
  publish's (``waiting``); a deduplication's or a delayed job's event is not announced.

Django's connection to another database (another PostgreSQL, MySQL, SQLite) cannot hold
Keel's rows: there each add is made once it commits (``AddedOnCommit``), which keeps a
rollback from adding anything but cannot keep a process that dies right after the commit
from losing the add.

Keel never commits, rolls back or closes the caller's connection. Keel's statements on it
resolve to Keel's schema (``KEEL_DATABASE_SCHEMA``, when it is not ``public``): the search
path is set for them alone and set back before the caller's own (``db.in_keel_schema``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session, scoped_session

from tasks.jobs.intake.promote import publish_ready
from tasks.jobs.model.errors import Refused
from tasks.jobs.store import upkeep
from tasks.platform.config import get_settings, sqlalchemy_url
from tasks.platform.db import borrowed_engine, in_keel_schema, transaction

log = logging.getLogger(__name__)
# How long a job recorded in a caller's transaction waits for its publish after the
# commit before the promoter publishes it instead.
BACKSTOP_S = 5.0


class ForeignDatabase(Refused):
    """``in_transaction`` was given a session of another database than Keel's."""

    code = "foreign_database"


class NoTransaction(Refused):
    """``in_transaction`` was given a connection that is not in a transaction."""

    code = "no_transaction"


@dataclass
class CallerTransaction:
    """The caller's transaction (as a Session on its connection), the jobs it recorded that
    wait for its commit, and what is announced only then (a job's event, a deduplication).
    This kind hears the commit from a SQLAlchemy ``Session``'s events."""

    session: Session
    owner: Any = None  # what the caller handed in: one transaction per owner when nested
    parked: list[str] = field(default_factory=list)
    announcements: list[Callable[[], object]] = field(default_factory=list)
    _armed: bool = False
    _generation: int = 0

    @contextmanager
    def statements(self) -> Iterator[Session]:
        """The caller's session for Keel's statements of the block: they resolve to Keel's
        schema (``KEEL_DATABASE_SCHEMA``), the caller's own ones after it to the caller's."""
        with in_keel_schema(self.session):
            yield self.session

    def hold(self, job_id: str) -> None:
        """Park a job recorded waiting in this transaction until the caller commits (inside
        ``statements``)."""
        self.hold_many([job_id])

    def hold_many(self, job_ids: list[str]) -> None:
        """``hold`` for many jobs (a bulk add's), in one statement."""
        if not job_ids:
            return
        upkeep.park(self.session, job_ids, BACKSTOP_S)
        self.parked.extend(job_ids)
        self._arm()

    def on_commit(self, announce: Callable[[], object]) -> None:
        """Call ``announce`` once the caller commits; never, if it rolls back."""
        self.announcements.append(announce)
        self._arm()

    def close(self) -> None:
        """The block ended (the caller's session stays the caller's)."""

    def _arm(self) -> None:
        """Listen for this transaction's end, once (the first job of the transaction)."""
        if self._armed:
            return
        self._armed = True
        self._listen(self._generation)

    def _listen(self, generation: int) -> None:
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


@dataclass
class HookedTransaction(CallerTransaction):
    """A transaction whose owner calls back once it commits (Django's ``on_commit``, which
    drops the callback if the block rolls back)."""

    hook: Callable[[Callable[[], None]], object] | None = None

    def _listen(self, generation: int) -> None:
        assert self.hook is not None
        self.hook(lambda: self._committed(generation))

    def close(self) -> None:
        self.session.close()  # Keel's Session on the caller's connection, not the connection


@dataclass
class NotifiedTransaction(CallerTransaction):
    """A transaction on a connection that cannot say it committed (SQLAlchemy Core, plain
    psycopg): Postgres says it, with the NOTIFY each held job sends, to the workers."""

    def hold_many(self, job_ids: list[str]) -> None:
        super().hold_many(job_ids)
        upkeep.notify_committed(self.session, job_ids)

    def on_commit(self, announce: Callable[[], object]) -> None:
        """Nothing in this process hears the commit: the publish's events are the job's."""

    def _listen(self, generation: int) -> None:
        """The workers hear the commit (``tasks.jobs.upkeep.committed``)."""

    def close(self) -> None:
        self.session.close()


@dataclass
class AddedOnCommit:
    """A transaction on another database than Keel's that says when it commits (Django's
    ``on_commit``): nothing is recorded in it. Each add of the block is made, as a whole, once
    it has committed (Celery's ``delay_on_commit``), in Keel's own transactions; never, if it
    rolls back. The add's id is fixed when it is called, so its ``AsyncResult`` is known at
    once. What this cannot promise: a process that dies between the commit and the add loses
    the add, and a refusal (a tenant's quota, a database down) comes after the commit, raised
    from the commit as Django raises its ``on_commit`` callbacks' errors."""

    owner: Any
    hook: Callable[[Callable[[], None]], object]

    def defer(self, add: Callable[[], object]) -> None:
        """Make ``add`` once the caller commits, outside any caller's transaction."""

        def committed() -> None:
            token = _CALLER.set(None)
            try:
                add()
            finally:
                _CALLER.reset(token)

        self.hook(committed)

    def close(self) -> None:
        """The block ended; its adds wait for the commit."""


_CALLER: ContextVar[CallerTransaction | AddedOnCommit | None] = ContextVar(
    "keel_caller_tx", default=None
)


def current() -> CallerTransaction | None:
    """The caller's transaction jobs are recorded in here, if ``in_transaction`` is open
    on a connection to Keel's database."""
    caller = _CALLER.get()
    return caller if isinstance(caller, CallerTransaction) else None


def deferred() -> AddedOnCommit | None:
    """The caller's transaction on another database, whose adds wait for its commit."""
    caller = _CALLER.get()
    return caller if isinstance(caller, AddedOnCommit) else None


def _where(url: Any) -> tuple[Any, ...]:
    parsed = make_url(sqlalchemy_url(str(url))) if isinstance(url, str) else url
    host = parsed.host or parsed.query.get("host")
    return (host, parsed.port or 5432, parsed.database)


def _is_keels(theirs: tuple[Any, ...]) -> bool:
    return tuple(theirs) == _where(get_settings().sqlalchemy_url)


def _check_database(theirs: tuple[Any, ...]) -> None:
    ours = _where(get_settings().sqlalchemy_url)
    if tuple(theirs) != ours:
        raise ForeignDatabase(
            f"in_transaction needs a connection to Keel's database {ours[2]!r} on {ours[0]}:"
            f"{ours[1]}; this one is connected to {theirs[2]!r} on {theirs[0]}:{theirs[1]}"
        )


def _psycopg_where(connection: Any) -> tuple[Any, ...]:
    info = connection.info
    return (info.host, int(info.port or 5432), info.dbname)


# Keel's engine over each borrowed psycopg connection, made once per connection.
_BORROWED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _on_borrowed(connection: Any) -> Session:
    """A Session of Keel's on a psycopg connection the caller owns (``db.borrowed_engine``)."""
    if connection.closed:
        raise TypeError("in_transaction was given a closed psycopg connection")
    if connection.autocommit:
        raise NoTransaction(
            "in_transaction needs a connection in a transaction: this psycopg connection is "
            "in autocommit mode, where each job would commit on its own"
        )
    _check_database(_psycopg_where(connection))
    engine = _BORROWED.get(connection)
    if engine is None:
        engine = _BORROWED[connection] = borrowed_engine(connection)
    return Session(engine)


def _caller_transaction(target: Any) -> CallerTransaction | AddedOnCommit:
    """The kind of caller transaction ``target`` is (see the module)."""
    if isinstance(target, scoped_session):  # Flask-SQLAlchemy's ``db.session``
        target = target()
    if isinstance(target, Session):
        _check_database(_where(target.get_bind().engine.url))
        return CallerTransaction(target, owner=target)
    if isinstance(target, Connection):  # SQLAlchemy Core
        if not target.in_transaction():
            raise NoTransaction(
                "in_transaction needs a SQLAlchemy Connection in a transaction "
                "(connection.begin(), or engine.begin())"
            )
        _check_database(_where(target.engine.url))
        return NotifiedTransaction(Session(bind=target), owner=target)
    if isinstance(target, psycopg.Connection):
        return NotifiedTransaction(_on_borrowed(target), owner=target)
    if callable(getattr(target, "on_commit", None)) and hasattr(target, "in_atomic_block"):
        return _django(target)
    raise TypeError(
        "in_transaction takes a SQLAlchemy Session or Connection, a psycopg Connection or "
        f"Django's connection, not {type(target)!r}"
    )


def _django(connection: Any) -> CallerTransaction | AddedOnCommit:
    """Django's connection (``django.db.connection``), inside ``atomic()``: jobs are recorded
    on it when it is Keel's database (PostgreSQL on psycopg 3), else added once it commits
    (any of Django's databases: another PostgreSQL, MySQL, SQLite)."""
    if not connection.in_atomic_block:
        raise NoTransaction(
            "in_transaction(django.db.connection) needs an atomic() block: outside one, "
            "Django commits each statement on its own"
        )
    connection.ensure_connection()
    raw = connection.connection
    if isinstance(raw, psycopg.Connection) and _is_keels(_psycopg_where(raw)):
        return HookedTransaction(_on_borrowed(raw), owner=connection, hook=connection.on_commit)
    return AddedOnCommit(owner=connection, hook=connection.on_commit)


@contextmanager
def in_transaction(target: Any) -> Iterator[CallerTransaction | AddedOnCommit]:
    """Record the jobs added in this block in the transaction of ``target``: a SQLAlchemy
    ``Session`` or ``Connection``, a psycopg ``Connection`` or Django's (see the module).

    The block does not commit: the caller does, as it would anyway. Blocks may nest; an
    inner one naming another connection records there.
    """
    outer = _CALLER.get()
    owner = target() if isinstance(target, scoped_session) else target
    tx = outer if outer is not None and outer.owner is owner else _caller_transaction(target)
    token = _CALLER.set(tx)
    try:
        yield tx
    finally:
        _CALLER.reset(token)
        if tx is not outer:
            tx.close()


def publish_now(job_ids: list[str]) -> None:
    """Promote and publish jobs a caller's transaction just committed, in one transaction."""
    if not job_ids:
        return
    with transaction() as session:
        ready = upkeep.promote_now(session, job_ids)
        publish_ready(session, ready, announce_waiting=True)

"""Postgres access: one declarative base, engines made per process.

The engines are created lazily and re-created after a fork, so Celery's
prefork children and gunicorn workers never share a connection pool with
their parent. Callers own transactions (``with transaction() as s:``);
helpers take a session and never commit.

Every round trip has a deadline (``tasks.platform.deadline``). An API request runs
its database work inside ``request_scope``: one deadline for all of it,
through an engine whose pool wait and server-side ``statement_timeout`` fit
inside that deadline, so a hung or overloaded Postgres costs a request at
most ``KEEL_REQUEST_DEADLINE_S`` (1 s) before it is answered 503. Everything else
(workers, beat, CLI) uses an engine with generous limits.

The server settings of Keel's connections (``server_settings``: the statement and
idle-in-transaction timeouts, the schema's search path) go in libpq's startup ``options``.
Behind a transaction pooler (``KEEL_DATABASE_POOLER=transaction``: PgBouncer's
``pool_mode = transaction``), which refuses those options and hands each transaction a
server connection of its own choosing, no startup option is sent: every transaction
begins with one statement setting them for itself (``set_config(..., true)``, as ``SET
LOCAL`` does), single statements run inside such a transaction too, and psycopg prepares
no statements (a prepared statement lives on one server connection).
"""

from __future__ import annotations

import logging
import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import MetaData, TextClause, create_engine, event, text
from sqlalchemy.engine import CursorResult, Engine, ExceptionContext, Result
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.pool import StaticPool

from tasks.platform import deadline
from tasks.platform.config import get_settings

log = logging.getLogger(__name__)
T = TypeVar("T")

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
# The records cannot be reached: database down, hung (our deadline), restarting,
# or out of connections. Workers give the delivery back; the API answers 503.
STORE_UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout, deadline.StoreTimeout)
# Of those, the SQLSTATEs that pass: the connection (08), a deadlock or serialization
# failure (40), a lock or statement timeout (55P03, 57014), the server shutting down or
# restarting (57P01-57P03), out of connections (53300), a session the server ended for
# its idleness or its transaction's length (SESSION_ENDED_SQLSTATES). Others of
# OperationalError's classes (a program limit exceeded, say) fail the same statement every
# time.
PASSING_SQLSTATES = (
    "08", "40", "55P03", "57014", "57P01", "57P02", "57P03", "57P05", "53300", "25P03", "25P04"
)  # fmt: skip
# The server ended the session: a transaction left idle (``IDLE_IN_TRANSACTION_S``: a
# process frozen, a host cut off) or open too long. psycopg reports these two as an
# InternalError (their class, 25, is "invalid transaction state"); for Keel they are a
# lost connection: the transaction was rolled back and the connection is gone
# (``_session_ended``).
SESSION_ENDED_SQLSTATES = ("25P03", "25P04")


# Of those, the ones after which Postgres surely did nothing of the transaction: a
# serialization failure or a deadlock (it rolls the transaction back; the client got the
# answer). Trying the same transaction again at once is safe; a lost connection is not
# (a commit may have happened without its answer).
ROLLED_BACK_SQLSTATES = ("40001", "40P01")
ROLLED_BACK_TRIES = 3


def rolled_back(exc: BaseException) -> bool:
    """Whether ``exc`` says Postgres rolled the whole transaction back (see above)."""
    return isinstance(exc, OperationalError) and (
        getattr(exc.orig, "sqlstate", None) in ROLLED_BACK_SQLSTATES
    )


def tried_again_if_rolled_back(write: Callable[[], T], tries: int = ROLLED_BACK_TRIES) -> T:
    """``write()`` (a whole transaction, or one statement alone), again after a short random
    wait when Postgres rolled it back as a deadlock's victim or a serialization failure, up
    to ``tries`` times; any other error, or the last one, is raised."""
    for tried in range(1, tries + 1):
        try:
            return write()
        except OperationalError as exc:
            if tried == tries or not rolled_back(exc):
                raise
            log.info("rolled back (%s); trying again", getattr(exc.orig, "sqlstate", None))
            time.sleep(random.uniform(0.005, 0.05) * tried)
    raise AssertionError("unreachable")


def passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a store error that trying again later may not meet: the
    database away, hung or busy, rather than refusing what it was asked."""
    if isinstance(exc, PoolTimeout | InterfaceError | deadline.StoreTimeout):
        return True
    if not isinstance(exc, OperationalError):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(PASSING_SQLSTATES)  # None: no answer at all


# Postgres ends a session left idle inside a transaction this long. Its client
# has given up on it (no Keel client waits between two statements longer than
# its own round-trip deadline), or cannot say so: a host cut off the network
# mid-transaction sends nothing, so the server would keep the transaction, and
# its row locks, until TCP keepalive notices the dead peer (two hours by default).
# Meanwhile no other worker could requeue or claim the jobs it had locked.
IDLE_IN_TRANSACTION_S = deadline.BACKGROUND_S + 5
KINDS = ("request", "background")
POOL_SIZE = 5  # connections an engine keeps open (up to 10 more while busy)


def _limits(kind: str) -> dict[str, Any]:
    """Deadlines of an engine: an API request's (``KEEL_REQUEST_DEADLINE_S``), or the rest's."""
    if kind == "request":
        seconds = get_settings().request_deadline_s
        return {
            "pool_timeout": seconds,
            "connect_timeout": 2,  # libpq's floor; the request deadline cuts in earlier
            "statement_timeout_ms": int(seconds * 1000),
        }
    return {"pool_timeout": 5, "connect_timeout": 5, "statement_timeout_ms": 0}


class Base(DeclarativeBase):
    """Declarative base of every Keel table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


_state: dict[str, Any] = {}
_lock = threading.RLock()


def schema() -> str:
    """The Postgres schema of Keel's tables (``KEEL_DATABASE_SCHEMA``; ``public`` by default)."""
    return get_settings().database_schema


def pooled() -> bool:
    """Whether Keel's connections go through a transaction pooler (``KEEL_DATABASE_POOLER``)."""
    return get_settings().database_pooler == "transaction"


def server_settings(kind: str) -> dict[str, str]:
    """The server settings every transaction on an engine of ``kind`` runs under.

    The timeouts (see ``IDLE_IN_TRANSACTION_S`` and ``_limits``), and the search path:
    Keel's statements name their tables and functions unqualified, and its triggers'
    functions do too, so on a connection of Keel's they all resolve to
    ``KEEL_DATABASE_SCHEMA`` through it. No search path for ``public``, where an install's
    connections stay as they always were."""
    found = {
        "statement_timeout": str(_limits(kind)["statement_timeout_ms"]),
        "idle_in_transaction_session_timeout": str(int(IDLE_IN_TRANSACTION_S * 1000)),
    }
    if schema() != "public":
        found["search_path"] = schema()
    return found


def startup_options(settings: dict[str, str]) -> str:
    """``settings`` as libpq's startup ``options`` text (a connection's whole life)."""
    return " ".join(f"-c {name}={value}" for name, value in settings.items())


def settings_statement(settings: dict[str, str]) -> str:
    """``settings`` as one statement that sets them for the current transaction only.

    The values are numbers and a plain SQL name (``KEEL_DATABASE_SCHEMA`` is checked when
    the settings are read): written into the text, so the statement has no parameters."""
    calls = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in settings.items())
    return f"SELECT {calls}"


def begin_statement(kind: str) -> str | None:
    """Behind a transaction pooler, the statement that begins each transaction on an engine
    of ``kind`` (``settings_statement``); None on a direct connection, where the settings are
    startup options."""
    return settings_statement(server_settings(kind)) if pooled() else None


def _create(kind: str) -> Engine:
    limits = _limits(kind)
    settings = server_settings(kind)
    connect_args: dict[str, Any] = {"connect_timeout": limits["connect_timeout"]}
    if pooled():
        # No startup options (a transaction pooler refuses them), and no prepared
        # statements: the next transaction may run on a server connection that lacks them.
        connect_args["prepare_threshold"] = None
    else:
        connect_args["options"] = startup_options(settings)
    created = create_engine(
        get_settings().sqlalchemy_url,
        pool_size=POOL_SIZE,
        max_overflow=10,
        pool_timeout=limits["pool_timeout"],
        connect_args=connect_args,
    )
    statement = begin_statement(kind)

    @event.listens_for(created, "do_connect")
    def _connect(dialect, record, cargs, cparams):  # psycopg, with our deadlines
        return deadline.DeadlineConnection.connect(*cargs, **cparams)

    event.listen(created, "handle_error", _session_ended, retval=True)

    @event.listens_for(created, "checkout")
    def _checkout(dbapi_connection, record, proxy):  # SQLAlchemy then connects afresh
        if not still_open(dbapi_connection):
            raise DisconnectionError("the server closed this pooled connection")

    if statement is not None:

        @event.listens_for(created, "begin")
        def _begin(connection):  # the transaction's first statement, before the caller's
            if not connection.connection.dbapi_connection.autocommit:
                connection.exec_driver_sql(statement)

    return created


def _session_ended(context: ExceptionContext) -> BaseException | None:
    """A session the server ended (``SESSION_ENDED_SQLSTATES``) raised as what it is to
    Keel: an ``OperationalError`` on an invalidated connection, one of ``STORE_UNAVAILABLE``
    (a worker gives the delivery back, the API answers 503), never a job's failure."""
    original = context.original_exception
    if getattr(original, "sqlstate", None) not in SESSION_ENDED_SQLSTATES:
        return None
    context.is_disconnect = True  # the pool drops the connection, as for a lost one
    return OperationalError(
        context.statement, context.parameters, original, connection_invalidated=True
    )


def warm(seconds: float = 5.0) -> int:
    """Open this process's request pool (``POOL_SIZE`` connections, each asked one
    ``SELECT 1``) before it serves; how many it opened.

    A process's first requests otherwise pay, inside their 1 s deadline, for SQLAlchemy's
    first-connect checks of the server (taken by one request while the others wait for it)
    and for a new server process per connection: a burst of them on a fresh API process
    on a busy host was answered 503. Called by each API worker before it accepts requests
    (``web.gunicorn_conf``). A database that does not answer within ``seconds`` leaves the
    rest unopened: the process serves anyway, and its requests answer 503 as they would.
    """
    opened: list[Any] = []
    with request_scope(seconds):
        try:
            made = engine()
            for _ in range(POOL_SIZE):
                connection = made.connect()
                try:
                    connection.exec_driver_sql("SELECT 1")
                except BaseException:
                    connection.invalidate()  # cut mid-statement: never back to the pool
                    connection.close()
                    raise
                opened.append(connection)
        except STORE_UNAVAILABLE as error:
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            log.warning(
                "the request pool opened %d connections of %d: %s",
                len(opened),
                POOL_SIZE,
                first_line,
            )
        finally:
            for connection in opened:
                connection.close()  # back to the pool, open
    return len(opened)


def still_open(dbapi_connection: Any) -> bool:
    """Whether an idle pooled connection is still open, without a round trip.

    An idle connection has nothing to read: when its socket is readable, the
    server has said goodbye (restart, ``pg_terminate_backend``, an idle
    timeout) and closed it. This replaces a ``SELECT 1`` pre-ping per checkout
    — a round trip on every transaction of the hot path. What it cannot see (a
    peer cut off without a word) the round-trip deadlines catch (``tasks.platform.deadline``),
    as they would have caught a pre-ping hanging on it.
    """
    if dbapi_connection.closed:
        return False
    try:
        poller = select.poll()
        poller.register(dbapi_connection.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    except Exception:  # no socket left to ask
        return False


def _scope() -> tuple[Engine, sessionmaker[Session], str | None]:
    """This process's engine for the caller's scope, its sessions, and ``begin_statement``."""
    kind = "request" if deadline.budgeted() else "background"
    with _lock:
        if _state.get("pid") != os.getpid():
            dispose()  # inherited from the parent: never touch its connections
            _state["pid"] = os.getpid()
        if kind not in _state:
            made = _create(kind)
            _state[kind] = (made, sessionmaker(made, expire_on_commit=False), begin_statement(kind))
        return _state[kind]


def engine() -> Engine:
    """This process's engine for the caller's scope (an API request or background work)."""
    return _scope()[0]


def dispose() -> None:
    """Forget this process's engines (after a fork, or in tests)."""
    _state.pop("pid", None)
    for kind in KINDS:
        made = _state.pop(kind, None)
        if made is not None:
            made[0].dispose(close=False)


@contextmanager
def request_scope(seconds: float | None = None) -> Iterator[None]:
    """Database work of one API request: one deadline for all of it (``KEEL_REQUEST_DEADLINE_S``
    unless ``seconds`` is given)."""
    with deadline.budget(seconds or get_settings().request_deadline_s):
        yield


@contextmanager
def transaction(*, one_statement: bool = False) -> Iterator[Session]:
    """A session inside one committed-or-rolled-back transaction.

    ``one_statement=True``: the block runs a single statement, which is its own
    transaction — sent in autocommit, without the ``BEGIN`` and ``COMMIT`` round
    trips (the hot path's transitions: an add, a claim, a completion). Session
    events (``after_commit``) fire as for any transaction. Behind a transaction pooler it is
    an ordinary transaction: only inside one do the server settings (``begin_statement``)
    hold for the statement.
    """
    deadline.start()  # a request's wait for a pooled connection counts toward its deadline
    made, sessions, begins = _scope()
    if not one_statement or begins is not None:
        with sessions.begin() as session:
            yield session
        return
    with made.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        with Session(bind=connection, expire_on_commit=False) as session:
            yield session
            session.commit()


# psycopg's text of each statement ``run_alone`` was given (module constants), per dialect.
_driver_sql: dict[TextClause, str] = {}


def run_alone(statement: TextClause, params: dict[str, Any]) -> dict[str, Any] | None:
    """Run one statement in autocommit on a pooled connection, without a Session: its first
    row (as a dict), or ``None``.

    For the hot path's guarded transitions (a worker's claim and completion): through a
    Session a statement costs its client ~0.3 ms of CPU, through the connection alone
    ~0.1 ms. The pool, its checks and the round-trip deadlines are the same as a
    ``transaction``'s; errors are raised as a Session raises them (SQLAlchemy's, so
    ``STORE_UNAVAILABLE`` still names them), and a dead connection leaves the pool. Behind a
    transaction pooler the statement runs in a transaction that ``begin_statement`` begins.
    """
    deadline.start()
    made, _, begins = _scope()
    sql = _driver_sql.get(statement)
    if sql is None:
        sql = _driver_sql[statement] = str(statement.compile(dialect=made.dialect))
    try:
        pooled = made.raw_connection()
    except psycopg.Error as exc:  # no connection to be had: as Engine.connect() raises it
        raise DBAPIError.instance(None, None, exc, psycopg.Error, dialect=made.dialect) from exc
    try:
        connection: psycopg.Connection = pooled.driver_connection  # type: ignore[assignment]
        try:
            if begins is not None:
                with connection.transaction(), connection.cursor(row_factory=dict_row) as cursor:
                    cursor.execute(begins)
                    cursor.execute(sql, params)
                    return cursor.fetchone() if cursor.description else None
            connection.autocommit = True
            try:
                with connection.cursor(row_factory=dict_row) as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchone() if cursor.description else None
            finally:
                if not connection.closed:
                    connection.autocommit = False
        except psycopg.Error as exc:
            gone = connection.closed or made.dialect.is_disconnect(exc, pooled, None)  # type: ignore[arg-type]
            if gone:
                pooled.invalidate(exc)
            raise DBAPIError.instance(
                sql, params, exc, psycopg.Error, connection_invalidated=gone, dialect=made.dialect
            ) from exc
    finally:
        pooled.close()


def affected(result: Result[Any]) -> int:
    """How many rows an UPDATE or DELETE touched (``Result`` is typed without it)."""
    return cast(CursorResult[Any], result).rowcount or 0


def borrowed_engine(connection: Any) -> Engine:
    """An engine over a psycopg connection its caller owns (a plain psycopg connection, or
    Django's): Keel's statements run on it, in the caller's transaction, and Keel never
    commits, rolls it back or closes it — the caller does what it would do anyway."""
    borrowed = create_engine(
        "postgresql+psycopg://",
        creator=lambda: connection,
        poolclass=StaticPool,
        pool_reset_on_return=None,
    )
    dialect: Any = borrowed.dialect
    dialect.do_commit = dialect.do_rollback = dialect.do_close = _leave_it
    return borrowed


def _leave_it(dbapi_connection: Any) -> None:
    """What a borrowed connection's commit, rollback and close do here: nothing."""


@contextmanager
def in_keel_schema(session: Session) -> Iterator[None]:
    """Keel's statements inside the block resolve to Keel's schema on a connection that is not
    Keel's (a caller's, in its transaction: ``tasks.jobs.intake.caller_transaction``), and the
    caller's own search path is back as it was after them.

    The caller's value is set again as it was found (``SET LOCAL`` semantics both ways: the
    transaction's end undoes either). Nothing is sent for ``public``. Raised out of the block,
    the restore is tried, and its own failure (a transaction Postgres already aborted, which
    the caller must roll back anyway) does not hide the block's error.
    """
    name = schema()
    if name == "public":
        yield
        return
    saved = session.execute(
        text("SELECT current_setting('search_path'), set_config('search_path', :name, true)"),
        {"name": name},
    ).scalar_one()
    restore = text("SELECT set_config('search_path', :saved, true)")
    try:
        yield
    except BaseException:
        try:
            session.execute(restore, {"saved": saved})
        except Exception:
            log.debug("the caller's search path was not set back", exc_info=True)
        raise
    session.execute(restore, {"saved": saved})

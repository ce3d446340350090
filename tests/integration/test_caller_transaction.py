"""Jobs recorded in the caller's own transaction (``tasks.jobs.in_transaction``).

The caller is an application of its own: its engine, its table, its sessions, as a Flask
view with SQLAlchemy has. A real ``celery worker`` runs the jobs.
"""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime

import pytest
from celery import chord
from sqlalchemy import URL, create_engine, text
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from tasks.jobs import Owner, acting_as, in_transaction, recorded_together
from tasks.jobs.intake.caller_transaction import (
    BACKSTOP_S,
    ForeignDatabase,
)
from tasks.platform.config import get_settings, sqlalchemy_url
from tests.support import events
from tests.support.client import record, ts, unique, wait_state
from tests.support.databases import fresh_database
from tests.support.jobs import celery_add, celery_collect, celery_part
from tests.support.stack import PROJECT_ROOT, WorkerProcess

pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("worker")]


@pytest.fixture(scope="module")
def users_engine():
    """The application's own engine and table, on Keel's database."""
    engine = create_engine(get_settings().sqlalchemy_url)
    with engine.begin() as connection:
        connection.execute(
            text("CREATE TABLE IF NOT EXISTS shop_orders (id text PRIMARY KEY, job_id text)")
        )
    yield engine
    engine.dispose()


def test_only_committed_views_have_jobs_and_each_runs_once(users_engine):
    committed, rolled_back = [], []
    for n in range(100):  # 100 views, every other one rolled back
        order = f"order-{uuid.uuid4().hex[:8]}"
        with Session(users_engine) as session:
            with in_transaction(session):
                job_id = celery_add.delay(n, 1000).id
            session.execute(
                text("INSERT INTO shop_orders (id, job_id) VALUES (:id, :job)"),
                {"id": order, "job": job_id},
            )
            if n % 2:
                session.rollback()
                rolled_back.append(job_id)
            else:
                # Not committed yet: nobody else sees the job, no worker runs it
                assert record(job_id) is None
                session.commit()
                committed.append((job_id, n))
    for job_id, n in committed:
        done = wait_state(job_id, "completed", timeout=30)
        assert (done["result"], done["attemptsStarted"]) == (n + 1000, 1)
    for job_id in rolled_back:
        assert record(job_id) is None
    with users_engine.connect() as connection:
        kept = connection.execute(
            text("SELECT job_id FROM shop_orders WHERE job_id = ANY(:ids)"),
            {"ids": [job_id for job_id, _ in committed] + rolled_back},
        ).scalars()
        assert sorted(kept) == sorted(job_id for job_id, _ in committed)


KILLED_AFTER_COMMIT = """
import os, signal, sys
from sqlalchemy import create_engine, event
from sqlalchemy.orm import Session
from tasks.platform.config import get_settings
from tasks.jobs import in_transaction, recorded_together
from tests.support.jobs import celery_add

engine = create_engine(get_settings().sqlalchemy_url)
with Session(engine) as session:
    # Registered before Keel's own listener: the process dies once the commit is done and
    # before Keel publishes anything.
    event.listen(session, "after_commit", lambda s: os.kill(os.getpid(), signal.SIGKILL))
    with in_transaction(session):
        print(celery_add.delay(20, 22).id, flush=True)
    session.commit()
print("not reached", flush=True)
"""

KILLED_AFTER_COMMIT_PSYCOPG = """
import os, signal
import psycopg
from tasks.platform.config import get_settings
from tasks.jobs import in_transaction
from tests.support.jobs import celery_add

url = get_settings().sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)
connection = psycopg.connect(url)
with in_transaction(connection):
    print(celery_add.delay(20, 22).id, flush=True)
connection.commit()
# Dies right after its commit: nothing of the publish may be left to this process
os.kill(os.getpid(), signal.SIGKILL)
print("not reached", flush=True)
"""


@pytest.mark.parametrize(
    "script", [KILLED_AFTER_COMMIT, KILLED_AFTER_COMMIT_PSYCOPG], ids=["session", "psycopg"]
)
def test_a_process_killed_between_its_commit_and_the_publish_loses_no_job(script):
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr
    [job_id] = done.stdout.split()
    # The promoter publishes it once its parking runs out
    finished = wait_state(job_id, "completed", "failed", timeout=BACKSTOP_S + 30)
    assert (finished["state"], finished["result"], finished["attemptsStarted"]) == (
        "completed",
        42,
        1,
    )


def another_database() -> URL:
    """A database of its own on Keel's Postgres server (``shop_elsewhere``, made afresh):
    the URL of Keel's, with its name."""
    settings = get_settings()
    admin = create_engine(sqlalchemy_url(settings.database_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text("DROP DATABASE IF EXISTS shop_elsewhere"))
        connection.execute(text("CREATE DATABASE shop_elsewhere"))
    admin.dispose()
    return create_engine(settings.sqlalchemy_url).url.set(database="shop_elsewhere")


def test_a_session_of_another_database_is_refused_before_anything_is_recorded():
    url = another_database()
    elsewhere = create_engine(url)
    try:
        with (
            Session(elsewhere) as session,
            pytest.raises(ForeignDatabase, match="shop_elsewhere"),
            in_transaction(session),
        ):
            pytest.fail("the block must not run")
    finally:
        elsewhere.dispose()


DJANGO_ELSEWHERE = """
import json, sys
import django
from django.conf import settings

settings.configure(DATABASES={"default": json.loads(sys.argv[1])}, USE_TZ=True)
django.setup()
from celery import chord
from django.db import connection, transaction

from keel import get_job, in_transaction, recorded_together
from tests.support.jobs import celery_add, celery_collect, celery_part

label = sys.argv[2]
sent = {}
try:
    with transaction.atomic(), in_transaction(connection):
        sent["dropped"] = [celery_add.delay(1, 2).id]
        with recorded_together():
            sent["dropped"] += [celery_add.delay(n, 3).id for n in range(3)]
        raise RuntimeError("the view failed")
except RuntimeError:
    pass
with transaction.atomic():
    with in_transaction(connection):
        sent["kept"] = celery_add.delay(20, 22).id
        with recorded_together():
            sent["together"] = [celery_add.delay(n, 100).id for n in range(3)]
        parts = [celery_part.s(i, f"{label}-{i}") for i in range(3)]
        sent["chord"] = chord(parts)(celery_collect.s()).id
    sent["seen_before_commit"] = [get_job(sent["kept"]), get_job(sent["chord"])] != [None, None]
print(json.dumps(sent), flush=True)
"""


def djangos_database(url: URL) -> dict[str, str]:
    """Django's ``DATABASES`` entry for the PostgreSQL database at ``url``."""
    host = url.query.get("host", "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.database or "",
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or (host if isinstance(host, str) else host[0]),
        "PORT": str(url.port or ""),
    }


def run_django(script: str, django_db: dict[str, str], label: str) -> dict:
    """``script`` in a process of its own whose Django has ``django_db`` as its database; what
    it printed last (JSON)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(django_db), label],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("database", ["another postgres database", "sqlite"])
def test_djangos_connection_to_another_database_adds_its_jobs_once_it_commits(tmp_path, database):
    if database == "sqlite":
        django_db = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "app.db")}
    else:
        django_db = djangos_database(another_database())
    label = f"elsewhere-{uuid.uuid4().hex[:6]}"
    sent = run_django(DJANGO_ELSEWHERE, django_db, label)
    assert sent["seen_before_commit"] is False  # added once Django committed, not before
    assert [job for job in sent["dropped"] if record(job) is not None] == []
    assert wait_state(sent["kept"], "completed", timeout=60)["result"] == 42
    for n, job_id in enumerate(sent["together"]):
        assert wait_state(job_id, "completed", timeout=60)["result"] == n + 100
    body = wait_state(sent["chord"], "completed", "failed", timeout=60)
    assert (body["state"], body["attemptsStarted"]) == ("completed", 1), body
    assert [r["label"] for r in body["result"]["results"]] == [f"{label}-{i}" for i in range(3)]


DJANGO_ON_KEELS = """
import json, sys
import django
from django.conf import settings

settings.configure(DATABASES={"default": json.loads(sys.argv[1])}, USE_TZ=True)
django.setup()
from celery import chord
from django.db import connection, transaction

from keel import get_job, in_transaction, recorded_together
from tests.support.jobs import celery_add, celery_collect, celery_part

label = sys.argv[2]


def send(offset, tag):
    # A bulk add of a thousand and a chord of four parts, in Django's transaction
    with in_transaction(connection):
        with recorded_together():
            bulk = [celery_add.delay(n, offset).id for n in range(1000)]
        body = chord([celery_part.s(i, f"{tag}-{i}") for i in range(4)])(celery_collect.s())
    return bulk, body.id, [part.id for part in body.parent.results]


def on_djangos_connection(ids):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM jobs WHERE id = ANY(%s)", [ids])
        return cursor.fetchone()[0]


sent = {}
try:
    with transaction.atomic():
        bulk, body, parts = send(5000, f"{label}-rb")
        sent["dropped"] = [*bulk, body, *parts]
        raise RuntimeError("the view failed")
except RuntimeError:
    pass
with transaction.atomic():
    bulk, body, parts = send(7000, label)
    sent.update(kept=bulk, body=body, parts=parts)
    sent["in_djangos_transaction"] = on_djangos_connection([*bulk, body, *parts])
    sent["seen_outside_before_commit"] = [get_job(bulk[0]), get_job(body)] != [None, None]
print(json.dumps(sent), flush=True)
"""


def test_djangos_atomic_on_keels_database_holds_a_bulk_add_and_a_chord_in_its_transaction():
    label = f"django-{uuid.uuid4().hex[:6]}"
    keels = create_engine(get_settings().sqlalchemy_url).url
    sent = run_django(DJANGO_ON_KEELS, djangos_database(keels), label)
    # Recorded on Django's connection, in its transaction (1,000 adds, a body and 4 parts),
    # and seen by nobody else before it committed
    assert sent["in_djangos_transaction"] == 1005
    assert sent["seen_outside_before_commit"] is False
    # Committed: every one of the thousand runs once, and the chord's body once its parts did
    for n, job_id in enumerate(sent["kept"]):
        done = wait_state(job_id, "completed", "failed", timeout=120)
        assert (done["state"], done["result"], done["attemptsStarted"]) == (
            "completed",
            n + 7000,
            1,
        ), done
    body = wait_state(sent["body"], "completed", "failed", timeout=60)
    assert (body["state"], body["attemptsStarted"]) == ("completed", 1), body
    assert [r["label"] for r in body["result"]["results"]] == [f"{label}-{i}" for i in range(4)]
    assert [record(part)["attemptsStarted"] for part in sent["parts"]] == [1, 1, 1, 1]
    # Rolled back: none of the thousand, nor the chord, is recorded
    assert [job for job in sent["dropped"] if record(job) is not None] == []


def callers_connection(users_engine, kind: str):
    """A connection of the caller's of ``kind`` (a Session, plain psycopg or SQLAlchemy
    Core), in a transaction: each has ``commit``, ``rollback`` and ``close``."""
    if kind == "session":
        return Session(users_engine)
    return dict(core_and_psycopg(users_engine))[kind]()


def send_together(count: int, offset: int) -> list[str]:
    """``count`` adds in one bulk add (``recorded_together``); their ids."""
    with recorded_together():
        sent = [celery_add.delay(n, offset) for n in range(count)]
    return [result.id for result in sent]


@pytest.mark.parametrize("kind", ["session", "psycopg", "core"])
def test_a_bulk_add_of_a_thousand_jobs_commits_and_rolls_back_with_the_caller(users_engine, kind):
    def opened():
        return callers_connection(users_engine, kind)

    # Rolled back: none of the thousand is recorded
    connection = opened()
    try:
        with in_transaction(connection):
            dropped = send_together(1000, 5000)
        connection.rollback()
    finally:
        connection.close()
    # Committed: every one runs once
    connection = opened()
    try:
        with in_transaction(connection):
            kept = send_together(1000, 7000)
        assert record(kept[0]) is None  # not before the commit
        connection.commit()
    finally:
        connection.close()
    for n, job_id in enumerate(kept):
        done = wait_state(job_id, "completed", "failed", timeout=120)
        assert (done["state"], done["result"], done["attemptsStarted"]) == (
            "completed",
            n + 7000,
            1,
        ), done
    assert [job_id for job_id in dropped if record(job_id) is not None] == []


@pytest.mark.parametrize("kind", ["session", "psycopg", "core"])
def test_a_chord_in_the_block_commits_and_rolls_back_with_the_caller(users_engine, kind):
    def opened():
        return callers_connection(users_engine, kind)

    def send(label: str, connection) -> tuple[str, list[str]]:
        parts = [celery_part.s(i, f"{label}-{i}") for i in range(4)]
        with in_transaction(connection):
            body = chord(parts)(celery_collect.s())
        return body.id, [part.id for part in body.parent.results]

    # Rolled back: neither the body nor a part is recorded
    connection = opened()
    try:
        dropped_body, dropped_parts = send(f"chord-rb-{uuid.uuid4().hex[:6]}", connection)
        connection.rollback()
    finally:
        connection.close()
    # Committed: the parts run once each, and the body once with their results in order
    label = f"chord-c-{uuid.uuid4().hex[:6]}"
    connection = opened()
    try:
        body_id, part_ids = send(label, connection)
        assert record(body_id) is None  # not before the commit
        connection.commit()
    finally:
        connection.close()
    body = wait_state(body_id, "completed", "failed", timeout=BACKSTOP_S + 60)
    assert (body["state"], body["attemptsStarted"]) == ("completed", 1), body
    assert [r["label"] for r in body["result"]["results"]] == [f"{label}-{i}" for i in range(4)]
    assert [record(part)["attemptsStarted"] for part in part_ids] == [1, 1, 1, 1]
    assert [job for job in [dropped_body, *dropped_parts] if record(job) is not None] == []


def test_a_tenants_add_in_the_block_holds_no_lock_its_next_add_waits_for(users_engine):
    """The tenant's quota lock is not taken in the caller's transaction: it would be held
    until the caller commits, and the same thread's next add (on Keel's own connection)
    would wait for it for ever."""
    owner = Owner(f"tx-{uuid.uuid4().hex[:6]}", "alice")
    outside: list[str] = []
    with Session(users_engine) as session, acting_as(owner):
        with in_transaction(session):
            inside = celery_add.delay(1, 1).id
        # A job of the same tenant, added outside the block before the caller commits (in a
        # thread only so that a wait fails the test instead of hanging it)
        context = contextvars.copy_context()  # acting as the tenant, outside the block
        adder = threading.Thread(
            target=lambda: context.run(lambda: outside.append(celery_add.delay(2, 2).id))
        )
        adder.start()
        adder.join(timeout=10)
        assert outside, "the add outside the block waited on the caller's open transaction"
        session.commit()
    assert wait_state(inside, "completed")["result"] == 2
    assert wait_state(outside[0], "completed")["result"] == 4


def test_flask_sqlalchemys_scoped_session_is_taken(users_engine):
    scoped = scoped_session(sessionmaker(users_engine))
    try:
        with in_transaction(scoped):
            job_id = celery_add.delay(3, 4).id
        assert record(job_id) is None  # not committed yet
        scoped.commit()
        assert wait_state(job_id, "completed")["result"] == 7
    finally:
        scoped.remove()


def test_a_rolled_back_add_is_never_announced_even_after_a_later_commit(users_engine):
    with Session(users_engine) as session:
        with in_transaction(session):
            delayed = celery_add.apply_async((5, 5), countdown=600).id
        session.rollback()
        # The same session commits other work later: the rolled-back job stays unannounced
        session.execute(text("SELECT 1"))
        session.commit()
    with Session(users_engine) as session:
        with in_transaction(session):
            announced = celery_add.apply_async((6, 6), countdown=600).id
        session.commit()
    queue = celery_add.job_queue()
    assert events.names(queue, announced) == ["delayed"]  # a committed one is, once
    assert record(delayed) is None and events.names(queue, delayed) == []


# --- the caller's own connection, of other kinds: SQLAlchemy Core, plain psycopg --------------


def psycopg_connection():
    import psycopg

    url = get_settings().sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)
    return psycopg.connect(url)


def core_and_psycopg(users_engine):
    """(name, open a connection in a transaction, its commit, its rollback, its close)."""

    def core():
        connection = users_engine.connect()
        connection.begin()
        return connection

    return [("core", core), ("psycopg", psycopg_connection)]


@pytest.mark.parametrize("kind", ["core", "psycopg"])
def test_a_core_or_psycopg_callers_job_runs_once_committed_and_never_rolled_back(
    users_engine, kind
):
    opener = dict(core_and_psycopg(users_engine))[kind]
    sql = "INSERT INTO shop_orders (id, job_id) VALUES (%s, %s)"
    kept, dropped = [], []
    for n in range(6):
        connection = opener()
        try:
            with in_transaction(connection):
                job_id = celery_add.delay(n, 2000).id
            order = (f"order-{uuid.uuid4().hex[:8]}", job_id)
            if kind == "core":
                connection.exec_driver_sql(sql, order)
            else:
                connection.execute(sql, order)
            assert record(job_id) is None  # nobody else sees it before the commit
            if n % 2:
                connection.rollback()
                dropped.append(job_id)
            else:
                connection.commit()
                kept.append((job_id, n))
        finally:
            connection.close()
    for job_id, n in kept:
        done = wait_state(job_id, "completed", timeout=BACKSTOP_S + 30)
        assert (done["result"], done["attemptsStarted"]) == (n + 2000, 1), done
        # Published when the commit's NOTIFY reached a worker, not by the promoter once the
        # parking ran out: it ran before it was due
        assert ts(done["processedOn"]) < ts(done["runAt"]), done
    for job_id in dropped:
        assert record(job_id) is None


def test_a_psycopg_connection_in_autocommit_is_refused():
    from tasks.jobs.intake.caller_transaction import NoTransaction

    connection = psycopg_connection()
    connection.autocommit = True
    try:
        with pytest.raises(NoTransaction, match="autocommit"), in_transaction(connection):
            pytest.fail("the block must not run")
    finally:
        connection.close()


@pytest.fixture
def unheard_queue(stack):
    """A queue whose one worker does not listen for committed callers' jobs, on Keel's tables
    in a database of their own: nobody hears a caller's ``NOTIFY keel_committed`` (the suite's
    worker listens on the suite's database), so only the promoter can publish its jobs.

    ``KEEL_DATABASE_POOLER=transaction`` without ``KEEL_DATABASE_DIRECT_URL`` is what turns
    the listener off: it says so in the worker's log, which the fixture checks."""
    queue = unique("unheard")
    with fresh_database():
        env = {"KEEL_DATABASE_POOLER": "transaction"}
        worker = WorkerProcess(stack.home, queue, concurrency=1, queues=queue, extra_env=env)
        worker.start()
        try:
            logged = worker.log_path.read_text(errors="replace")
            assert "not listening for committed jobs" in logged, worker.log_tail()
            yield queue
        finally:
            worker.stop()


def test_a_psycopg_callers_job_nobody_hears_committed_runs_once_from_the_backstop(
    unheard_queue,
):
    before = datetime.now(UTC)
    connection = psycopg_connection()
    try:
        with in_transaction(connection):
            job_id = celery_add.apply_async((20, 22), queue=unheard_queue).id
        connection.commit()
    finally:
        connection.close()
    done = wait_state(job_id, "completed", "failed", timeout=BACKSTOP_S + 30)
    assert (done["state"], done["result"], done["attemptsStarted"]) == ("completed", 42, 1), done
    assert len(done["runs"]) == 1, done["runs"]
    # Published by the promoter once its parking ran out, not at the commit
    assert ts(done["processedOn"]) >= ts(done["runAt"]), done
    waited = (ts(done["processedOn"]) - before).total_seconds()
    assert waited >= BACKSTOP_S - 0.001, done  # (the record's times are to the millisecond)

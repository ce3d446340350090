"""The sandbox's memory: groups, messages, sends and drops in one SQLite file.

SQLite in WAL mode keeps the provider's state across its own restarts (a test
may kill the provider mid-campaign) and is fast enough for a million-message
campaign when each request is one transaction with one ``executemany``.
Writes are serialized twice, by a lock for the threads of one server and by
``BEGIN IMMEDIATE`` for several processes on one file, so concurrent requests
can neither overfill a group nor send it twice.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provider_sandbox.errors import GroupAlreadySent, GroupNotEmpty, GroupNotFound
from provider_sandbox.payloads import Message

DATABASE_NAME = "provider.sqlite3"
SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    name TEXT,
    created_at TEXT NOT NULL,
    count INTEGER NOT NULL DEFAULT 0,
    duplicates INTEGER NOT NULL DEFAULT 0,
    sent_at TEXT,
    rejected_sends INTEGER NOT NULL DEFAULT 0,
    deleted_at TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    group_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    recipient TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (group_id, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS messages_by_message_id ON messages (message_id);
CREATE TABLE IF NOT EXISTS drops (
    group_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (group_id, message_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sends (
    group_id TEXT NOT NULL,
    sent_at TEXT NOT NULL,
    message_count INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sends_by_group ON sends (group_id);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    group_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
TABLES = ("groups", "messages", "drops", "sends", "idempotency", "settings")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Group:
    """A group as ``GET /v1/groups/<id>`` shows it."""

    group_id: str
    name: str | None
    count: int
    sent_at: str | None
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "groupId": self.group_id,
            "name": self.name,
            "count": self.count,
            "sent": self.sent_at is not None,
            "sentAt": self.sent_at,
            "createdAt": self.created_at,
        }


@dataclass(frozen=True)
class Added:
    """The outcome of one add: ``new`` claims every new message, stored or dropped."""

    new: int
    duplicates: int
    stored: int
    dropped: int


class GroupStore:
    """Every group operation, each one short transaction on the shared file."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.path = home / DATABASE_NAME
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 10000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")  # WAL: durable across process crashes
        self._db.executescript(SCHEMA)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, alone among this server's threads and processes."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A consistent read of several tables."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create_group(self, name: str | None, idempotency_key: str | None = None) -> Group:
        """A new group; the same ``idempotency_key`` again returns the group it created."""
        group = Group(f"grp_{uuid.uuid4().hex}", name, 0, None, now())
        with self.transaction() as db:
            if idempotency_key is not None:
                row = db.execute(
                    "SELECT group_id FROM idempotency WHERE key = ?", (idempotency_key,)
                ).fetchone()
                if row is not None:
                    return _any_group(db, row[0])
                db.execute(
                    "INSERT INTO idempotency (key, group_id) VALUES (?, ?)",
                    (idempotency_key, group.group_id),
                )
            db.execute(
                "INSERT INTO groups (group_id, name, created_at) VALUES (?, ?, ?)",
                (group.group_id, group.name, group.created_at),
            )
        return group

    def group(self, group_id: str) -> Group:
        with self.snapshot() as db:
            return _live_group(db, group_id)

    def add_messages(self, group_id: str, messages: list[Message], capacity: int) -> Added:
        """Store the new messages that fit; drop the rest without telling anyone."""
        with self.transaction() as db:
            group = _open_group(db, group_id)
            fresh = _fresh(db, group_id, messages)
            room = max(0, capacity - group.count)
            stored = _insert_messages(db, group_id, fresh[:room])
            duplicates = len(messages) - len(fresh)
            db.executemany(
                "INSERT OR IGNORE INTO drops (group_id, message_id) VALUES (?, ?)",
                [(group_id, m.message_id) for m in fresh[room:]],
            )
            db.execute(
                "UPDATE groups SET count = count + ?, duplicates = duplicates + ? "
                "WHERE group_id = ?",
                (stored, duplicates, group_id),
            )
        return Added(len(fresh), duplicates, stored, len(fresh) - stored)

    def send(self, group_id: str) -> Group:
        """Trigger the send once; every later trigger is counted and refused."""
        with self.transaction() as db:
            group = _live_group(db, group_id)
            if group.sent_at is None:
                sent_at = now()
                db.execute("UPDATE groups SET sent_at = ? WHERE group_id = ?", (sent_at, group_id))
                db.execute(
                    "INSERT INTO sends (group_id, sent_at, message_count) VALUES (?, ?, ?)",
                    (group_id, sent_at, group.count),
                )
                return Group(group_id, group.name, group.count, sent_at, group.created_at)
            db.execute(
                "UPDATE groups SET rejected_sends = rejected_sends + 1 WHERE group_id = ?",
                (group_id,),
            )
        raise GroupAlreadySent(details=[{"groupId": group_id, "sentAt": group.sent_at}])

    def delete_group(self, group_id: str) -> None:
        with self.transaction() as db:
            group = _live_group(db, group_id)
            if group.count or group.sent_at:
                raise GroupNotEmpty(details=[{"count": group.count, "sent": bool(group.sent_at)}])
            db.execute("UPDATE groups SET deleted_at = ? WHERE group_id = ?", (now(), group_id))

    def setting(self, key: str) -> Any:
        with self.snapshot() as db:
            row = db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def save_setting(self, key: str, value: Any) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    def reset(self) -> None:
        with self.transaction() as db:
            for table in TABLES:
                db.execute(f"DELETE FROM {table}")


def _any_group(db: sqlite3.Connection, group_id: str) -> Group:
    row = db.execute(
        "SELECT group_id, name, count, sent_at, created_at FROM groups WHERE group_id = ?",
        (group_id,),
    ).fetchone()
    return Group(*row)


def _live_group(db: sqlite3.Connection, group_id: str) -> Group:
    row = db.execute(
        "SELECT group_id, name, count, sent_at, created_at FROM groups "
        "WHERE group_id = ? AND deleted_at IS NULL",
        (group_id,),
    ).fetchone()
    if row is None:
        raise GroupNotFound(details=[{"groupId": group_id}])
    return Group(*row)


def _open_group(db: sqlite3.Connection, group_id: str) -> Group:
    group = _live_group(db, group_id)
    if group.sent_at is not None:
        raise GroupAlreadySent(details=[{"groupId": group_id, "sentAt": group.sent_at}])
    return group


def _fresh(db: sqlite3.Connection, group_id: str, messages: list[Message]) -> list[Message]:
    """The messages not yet in the group, first occurrence only, in request order."""
    placeholders = ", ".join("?" * len(messages))
    known = {
        row[0]
        for row in db.execute(
            f"SELECT message_id FROM messages WHERE group_id = ? "
            f"AND message_id IN ({placeholders})",
            (group_id, *(m.message_id for m in messages)),
        )
    }
    fresh = []
    for message in messages:
        if message.message_id not in known:
            known.add(message.message_id)
            fresh.append(message)
    return fresh


def _insert_messages(db: sqlite3.Connection, group_id: str, messages: list[Message]) -> int:
    before = db.total_changes
    db.executemany(
        "INSERT OR IGNORE INTO messages (group_id, message_id, recipient, text) "
        "VALUES (?, ?, ?, ?)",
        [(group_id, m.message_id, m.to, m.text) for m in messages],
    )
    return db.total_changes - before

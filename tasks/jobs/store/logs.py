"""The SQL of job logs: the lines a handler writes with ``job.log()`` / ``self.log()``.

A job's lines are numbered from 1 (``seq``) in the order they were written, across its
runs (each line keeps the attempt that wrote it). Only the newest ``keep`` are kept: each
append deletes what falls out of that window, in the same statement, so a handler that
logs in a loop costs a bounded table. The lines go with the job's record (a foreign key
``ON DELETE CASCADE``): retention and ``removeOnComplete`` trim them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

MAX_LINE_CHARS = 2_000  # a longer line is cut, and ends with "…"

# The next number is the job's highest + 1; a concurrent append of the same job (two runs
# of one job at once: a stalled run still going) that took it adds nothing, and is retried.
_APPEND = text(
    """
    WITH job AS (
        SELECT id FROM jobs WHERE id = CAST(:id AS varchar)
    ), line AS (
        INSERT INTO job_logs (job_id, seq, attempt, message)
        SELECT job.id, COALESCE((SELECT max(seq) FROM job_logs WHERE job_id = job.id), 0) + 1,
               CAST(:attempt AS integer), CAST(:message AS text)
        FROM job
        ON CONFLICT DO NOTHING
        RETURNING seq
    ), trimmed AS (
        DELETE FROM job_logs
        WHERE job_id = (SELECT id FROM job) AND seq <= (SELECT seq FROM line) - :keep
    )
    SELECT (SELECT seq FROM line) AS seq, (SELECT count(*) FROM job) AS found
    """
)


@dataclass(frozen=True)
class LogLine:
    seq: int
    attempt: int
    logged_at: datetime
    message: str


def clean(message: object) -> str:
    """The line as stored: UTF-8 text without NUL (Postgres text holds neither NUL nor a
    lone surrogate, as ``os.fsdecode`` makes of a file name's stray byte), at most
    ``MAX_LINE_CHARS`` long."""
    line = str(message).encode("utf-8", "backslashreplace").decode("utf-8")
    line = line.replace("\x00", "\ufffd")
    if len(line) > MAX_LINE_CHARS:
        line = line[: MAX_LINE_CHARS - 1] + "…"
    return line


class JobGone(Exception):
    """The job's record is gone (deleted while a run of it still logs)."""


def append(session: Session, job_id: str, attempt: int, message: str, keep: int) -> int | None:
    """Add a line to the job's log, keeping its newest ``keep``; its number (``None``: a
    concurrent append of the same job took the number, and saved its line: try again).
    Raises ``JobGone`` if the job has no record."""
    row = session.execute(
        _APPEND, {"id": job_id, "attempt": attempt, "message": message, "keep": keep}
    ).one()
    if not row.found:
        raise JobGone(job_id)
    return int(row.seq) if row.seq is not None else None


_LINES = "SELECT seq, attempt, logged_at, message FROM job_logs WHERE job_id = :id "


def lines(session: Session, job_id: str, after: int, limit: int) -> list[LogLine]:
    """The job's kept lines numbered above ``after``, oldest first, at most ``limit``."""
    where = "AND seq > :after ORDER BY seq LIMIT :limit"
    return _read(session, where, {"id": job_id, "after": after, "limit": limit})


def newest(session: Session, job_id: str, limit: int) -> list[LogLine]:
    """The job's newest ``limit`` lines, oldest first (the dashboard's view)."""
    rows = _read(session, "ORDER BY seq DESC LIMIT :limit", {"id": job_id, "limit": limit})
    return rows[::-1]


def _read(session: Session, rest: str, params: dict[str, object]) -> list[LogLine]:
    rows = session.execute(text(_LINES + rest), params).all()
    return [LogLine(r.seq, r.attempt, r.logged_at, r.message) for r in rows]


def written(session: Session, job_id: str) -> int:
    """How many lines the job has written in all (the kept ones are the newest of them)."""
    return int(
        session.execute(
            text("SELECT COALESCE(max(seq), 0) FROM job_logs WHERE job_id = :id"),
            {"id": job_id},
        ).scalar_one()
    )

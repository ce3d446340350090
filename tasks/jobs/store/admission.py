"""Admission: an add that takes a dedup claim or checks a tenant's quota, in one statement.

What used to be a transaction of four round trips (BEGIN, the quota lock with
the dedup claim, the counted insert, COMMIT) is one statement, sent in
autocommit: ``keel_admit_job`` (migrations 0009, 0016) takes the tenant's quota
lock, claims the dedup id (or finds the live job holding it) and counts the
party's load, each query with its own snapshot, so the count sees every add
committed before the lock was held; the statement then inserts the job
unless the id was held. Over the quota the function raises and the whole
statement — the dedup claim with it — is rolled back, as the transaction
was. Debounce rules (``extend``, ``replace``), which touch the held job, keep
the transaction (``tasks.jobs.intake.enqueue``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tasks.jobs.model.options import Deduplication
from tasks.jobs.store.jobs import INSERT_IF, NewJob, row_of
from tasks.platform.db import run_alone

OVER_QUOTA = "KQ001"  # keel_admit_job's SQLSTATE: the tenant is at its live-jobs quota

_ADMIT = text(
    f"""
    WITH admitted AS (
            SELECT * FROM keel_admit_job(
                :lock_key, :tenant_id, :queue, :dedup_id, CAST(:dedup_ttl_ms AS bigint), :id,
                CAST(:max_live AS bigint), CAST(:up_to AS bigint),
                CAST(:priority AS smallint))),
         added AS ({INSERT_IF.format(source="admitted", condition="admitted.kept IS NULL")})
    SELECT admitted.kept, (SELECT id FROM added) AS id, admitted.live, admitted.on_queue
    FROM admitted
    """
)


@dataclass(frozen=True)
class Admitted:
    """``kept``: the live job holding the dedup id (nothing was added); else ``created``
    (False: a job with this id exists) and the party's load before the add: its live jobs
    (counted only against a quota) and those running or waiting on the queue."""

    kept: str | None
    created: bool
    live: int | None
    on_queue: int


class OverQuota(Exception):
    """The tenant has ``live`` live jobs, its quota: nothing was recorded."""

    def __init__(self, live: int) -> None:
        super().__init__(f"{live} live jobs")
        self.live = live


def admit(
    job: NewJob,
    *,
    lock_key: str | None,
    dedup: Deduplication | None,
    max_live: int | None,
    up_to: int,
) -> Admitted:
    """Claim ``dedup`` (simple or throttle) and check ``max_live`` (under ``lock_key``), then
    record ``job``: one statement on its own, in autocommit (``tasks.platform.db.run_alone``).
    The party's jobs on the queue that rank at or before the job are counted up to ``up_to``
    (what places the job among the broker's priorities)."""
    params = {
        **row_of(job),
        "lock_key": lock_key,
        "dedup_id": dedup.id if dedup else None,
        "dedup_ttl_ms": dedup.ttl if dedup else None,
        "max_live": max_live,
        "up_to": up_to,
    }
    try:
        row = run_alone(_ADMIT, params)
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != OVER_QUOTA:
            raise
        raise OverQuota(int(exc.orig.diag.message_detail or 0)) from None  # type: ignore[union-attr]
    assert row is not None  # the statement returns one row
    return Admitted(
        kept=row["kept"],
        created=row["id"] is not None,
        live=None if row["live"] is None else int(row["live"]),
        on_queue=int(row["on_queue"] or 0),  # not counted when a held id kept the add
    )

"""Generations of a campaign: who fills which provider group, and when it may be sent.

Each rule is one atomic statement, the Postgres form of the usual Redis
commands:

- approval (``HINCRBY``): ``approved = approved + size RETURNING approved``;
  an approval is never given back, so a late chunk can never slip into a
  generation that was already closed;
- assignment is recorded in the same transaction as the approval, and
  before any message is loaded, so a retry returns to the same group;
- closing (``SET NX``): ``closed = true WHERE NOT closed RETURNING`` — one
  closer; the loser joins the next generation;
- the group (``SET NX``): ``group_id = :id WHERE group_id IS NULL`` — one
  group per generation; a loser deletes the empty group it made;
- sending is gated by the count equation: the generation is closed and
  every chunk assigned to it has its load record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from tasks.jobs.model.errors import ControlFlow
from tasks.platform.db import transaction


class Rollover(ControlFlow):
    """Another chunk is closing this generation: join the next one shortly."""

    code = "rollover"


@dataclass(frozen=True)
class Readiness:
    """Whether a generation may be sent, and why not."""

    closed: bool
    assigned: int
    loaded: int
    group_id: str | None
    sent: bool

    @property
    def complete(self) -> bool:
        """Closed, with a group, and every chunk assigned to it loaded. A generation no
        chunk joined (one prepared ahead that a failed chunk never reached) has nothing
        to send."""
        return (
            self.closed
            and self.group_id is not None
            and self.assigned > 0
            and self.assigned == self.loaded
        )


@dataclass(frozen=True)
class Approval:
    """One approval try on the campaign's current generation."""

    generation: int
    assigned: bool
    closed: bool
    group_id: str | None


# One statement: read the current generation, count the chunk into it (``HINCRBY``)
# and, if it still fits and the generation is open, record the assignment. The
# approval's row lock orders concurrent approvals; the assignment needs the
# approval's answer, so both are one statement rather than a transaction of four.
_APPROVE = text(
    """
    WITH approval AS (
        UPDATE campaign_generations SET approved = approved + :n
        WHERE campaign_id = :c
          AND generation = (SELECT current_generation FROM campaigns WHERE id = :c)
        RETURNING generation, approved, closed, group_id
    ), assignment AS (
        UPDATE campaign_chunks k SET generation = a.generation, assigned_at = clock_timestamp()
        FROM approval a
        WHERE k.campaign_id = :c AND k.chunk_no = :k AND k.generation IS NULL
          AND NOT a.closed AND a.approved <= :cap
        RETURNING k.generation
    )
    SELECT generation, NOT closed AND approved <= :cap AS assigned, closed, group_id,
           (SELECT count(*) FROM assignment) AS recorded
    FROM approval
    """
)


_OPEN = text(
    "INSERT INTO campaign_generations (campaign_id, generation) VALUES (:c, :g) "
    "ON CONFLICT DO NOTHING"
)


def open_in(session: Session, campaign_id: str, generation: int) -> None:
    """The generation's row, where its approvals are counted (no-op if it exists)."""
    session.execute(_OPEN, {"c": campaign_id, "g": generation})


def open_generation(campaign_id: str, generation: int) -> None:
    """``open_in``, on its own."""
    with transaction(one_statement=True) as session:
        open_in(session, campaign_id, generation)


def _assignment_of(campaign_id: str, chunk_no: int) -> Approval:
    with transaction(one_statement=True) as session:
        row = session.execute(
            text(
                "SELECT k.generation, g.group_id FROM campaign_chunks k "
                "JOIN campaign_generations g "
                "ON g.campaign_id = k.campaign_id AND g.generation = k.generation "
                "WHERE k.campaign_id = :c AND k.chunk_no = :k"
            ),
            {"c": campaign_id, "k": chunk_no},
        ).one()
    return Approval(row.generation, True, False, row.group_id)


def _approve(campaign_id: str, chunk_no: int, size: int, capacity: int) -> Approval:
    """One approval try on the current generation."""
    params = {"c": campaign_id, "k": chunk_no, "n": size, "cap": capacity}
    for _ in range(2):
        with transaction(one_statement=True) as session:
            row = session.execute(_APPROVE, params).first()
        if row is not None and row.assigned and not row.recorded:
            # Assigned meanwhile by another run of this chunk: that assignment stands.
            return _assignment_of(campaign_id, chunk_no)
        if row is not None:
            return Approval(row.generation, row.assigned, row.closed, row.group_id)
        # The current generation has no row yet (a campaign planned before rows were
        # opened with the generation): open it, then try once more.
        with transaction(one_statement=True) as session:
            current = session.execute(
                text("SELECT current_generation FROM campaigns WHERE id = :c"), {"c": campaign_id}
            ).scalar_one()
        open_generation(campaign_id, current)
    raise RuntimeError(f"campaign {campaign_id}: its current generation has no row")


def close(campaign_id: str, generation: int, *, open_next: bool) -> bool:
    """Close ``generation`` (first caller wins); ``open_next`` rolls the campaign over."""
    with transaction() as session:
        won = session.execute(
            text(
                "UPDATE campaign_generations SET closed = true, closed_at = clock_timestamp() "
                "WHERE campaign_id = :c AND generation = :g AND NOT closed RETURNING generation"
            ),
            {"c": campaign_id, "g": generation},
        ).first()
        if won and open_next:
            open_in(session, campaign_id, generation + 1)
            session.execute(
                text(
                    "UPDATE campaigns SET current_generation = :next "
                    "WHERE id = :c AND current_generation = :g"
                ),
                {"c": campaign_id, "g": generation, "next": generation + 1},
            )
    return won is not None


def assign(
    campaign_id: str,
    chunk_no: int,
    size: int,
    capacity: int,
    before_close: Callable[[int], None] | None = None,
) -> tuple[Approval, list[int]]:
    """Assign an unassigned chunk: its generation (and group, if made), and the generations
    this call closed on overflow.

    ``before_close(g)`` runs before this call tries to close generation ``g``, so before
    the next generation opens: what it commits precedes every assignment to a later
    generation.
    """
    closed_here: list[int] = []
    while True:
        approval = _approve(campaign_id, chunk_no, size, capacity)
        if approval.assigned:
            return approval, closed_here
        if approval.closed or readiness(campaign_id, approval.generation).closed:
            continue  # someone already rolled over: try the new current generation
        if before_close is not None:
            before_close(approval.generation)
        if not close(campaign_id, approval.generation, open_next=True):
            raise Rollover(f"generation {approval.generation} is being closed by another chunk")
        closed_here.append(approval.generation)


def attach_group(campaign_id: str, generation: int, group_id: str) -> str:
    """Record ``group_id`` unless the generation has one; returns the generation's group."""
    with transaction() as session:
        won = session.execute(
            text(
                "UPDATE campaign_generations SET group_id = :gid WHERE campaign_id = :c "
                "AND generation = :g AND group_id IS NULL RETURNING group_id"
            ),
            {"c": campaign_id, "g": generation, "gid": group_id},
        ).scalar()
        if won is not None:
            return won
        return session.execute(
            text(
                "SELECT group_id FROM campaign_generations "
                "WHERE campaign_id = :c AND generation = :g"
            ),
            {"c": campaign_id, "g": generation},
        ).scalar_one()


def record_load(campaign_id: str, chunk_no: int) -> bool:
    """The chunk's load record, written only after every message was accepted; the
    monitor's last sign of progress goes with it (one statement)."""
    with transaction(one_statement=True) as session:
        recorded = session.execute(
            text(
                """
                WITH loaded AS (
                    UPDATE campaign_chunks SET loaded_at = clock_timestamp()
                    WHERE campaign_id = :c AND chunk_no = :k AND loaded_at IS NULL RETURNING 1
                ), watched AS (
                    INSERT INTO campaign_watch (campaign_id, last_load_at)
                    VALUES (:c, clock_timestamp()) ON CONFLICT (campaign_id)
                    DO UPDATE SET last_load_at = EXCLUDED.last_load_at
                )
                SELECT count(*) FROM loaded
                """
            ),
            {"c": campaign_id, "k": chunk_no},
        ).scalar_one()
    return recorded > 0


_READINESS = """
    SELECT g.closed, g.group_id, g.sent_at IS NOT NULL AS sent,
           count(c.chunk_no) AS assigned, count(c.loaded_at) AS loaded{extra}
    FROM campaign_generations g
    LEFT JOIN campaign_chunks c
           ON c.campaign_id = g.campaign_id AND c.generation = g.generation
    WHERE g.campaign_id = :c AND g.generation = :g
    GROUP BY g.closed, g.group_id, g.sent_at
"""
_UNLOADED = "SELECT count(*) FROM campaign_chunks WHERE campaign_id = :c AND loaded_at IS NULL"


def readiness(campaign_id: str, generation: int) -> Readiness:
    with transaction(one_statement=True) as session:
        row = session.execute(
            text(_READINESS.format(extra="")), {"c": campaign_id, "g": generation}
        ).one()
    return Readiness(row.closed, row.assigned, row.loaded, row.group_id, row.sent)


def progress(campaign_id: str, generation: int) -> tuple[Readiness, bool]:
    """The generation's readiness and whether every chunk of the campaign is loaded, read
    in one statement (after the caller's load record is committed, so of two chunks
    finishing at once, the later reader sees both loads)."""
    with transaction(one_statement=True) as session:
        row = session.execute(
            text(_READINESS.format(extra=f", ({_UNLOADED}) AS unloaded")),
            {"c": campaign_id, "g": generation},
        ).one()
    ready = Readiness(row.closed, row.assigned, row.loaded, row.group_id, row.sent)
    return ready, row.unloaded == 0


def mark_sent(campaign_id: str, generation: int) -> bool:
    """The durable "sent" marker, written after the provider confirmed."""
    with transaction() as session:
        return (
            session.execute(
                text(
                    "UPDATE campaign_generations SET sent_at = clock_timestamp() "
                    "WHERE campaign_id = :c AND generation = :g AND sent_at IS NULL RETURNING 1"
                ),
                {"c": campaign_id, "g": generation},
            ).first()
            is not None
        )


def all_loaded(campaign_id: str) -> bool:
    with transaction(one_statement=True) as session:
        missing = session.execute(text(_UNLOADED), {"c": campaign_id}).scalar_one()
    return missing == 0


def generations(campaign_id: str) -> list[int]:
    with transaction() as session:
        return list(
            session.execute(
                text(
                    "SELECT generation FROM campaign_generations WHERE campaign_id = :c "
                    "ORDER BY generation"
                ),
                {"c": campaign_id},
            ).scalars()
        )


def record_attempt(campaign_id: str, generation: int, key: str) -> None:
    """Written before the provider is asked for a group, so its group can always be found."""
    with transaction() as session:
        session.execute(
            text(
                "INSERT INTO campaign_group_attempts (campaign_id, generation, key) "
                "VALUES (:c, :g, :k) ON CONFLICT DO NOTHING"
            ),
            {"c": campaign_id, "g": generation, "k": key},
        )


def attempts(campaign_id: str, generation: int) -> list[str]:
    with transaction() as session:
        return list(
            session.execute(
                text(
                    "SELECT key FROM campaign_group_attempts "
                    "WHERE campaign_id = :c AND generation = :g ORDER BY key"
                ),
                {"c": campaign_id, "g": generation},
            ).scalars()
        )

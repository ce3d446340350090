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

from dataclasses import dataclass

from sqlalchemy import text

from tasks.db import transaction
from tasks.jobs.errors import KeelError


class Rollover(KeelError):
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
        return self.closed and self.group_id is not None and self.assigned == self.loaded


def assigned_generation(campaign_id: str, chunk_no: int) -> int | None:
    with transaction() as session:
        return session.execute(
            text("SELECT generation FROM campaign_chunks WHERE campaign_id = :c AND chunk_no = :k"),
            {"c": campaign_id, "k": chunk_no},
        ).scalar()


def _approve(campaign_id: str, chunk_no: int, size: int, capacity: int) -> tuple[int, bool]:
    """One approval try on the current generation: ``(generation, assigned)``."""
    with transaction() as session:
        current = session.execute(
            text("SELECT current_generation FROM campaigns WHERE id = :c"), {"c": campaign_id}
        ).scalar_one()
        session.execute(
            text(
                "INSERT INTO campaign_generations (campaign_id, generation) VALUES (:c, :g) "
                "ON CONFLICT DO NOTHING"
            ),
            {"c": campaign_id, "g": current},
        )
        approved, closed = session.execute(
            text(
                "UPDATE campaign_generations SET approved = approved + :n "
                "WHERE campaign_id = :c AND generation = :g RETURNING approved, closed"
            ),
            {"c": campaign_id, "g": current, "n": size},
        ).one()
        if closed or approved > capacity:
            return current, False
        session.execute(
            text(
                "UPDATE campaign_chunks SET generation = :g, assigned_at = clock_timestamp() "
                "WHERE campaign_id = :c AND chunk_no = :k AND generation IS NULL"
            ),
            {"c": campaign_id, "g": current, "k": chunk_no},
        )
        return current, True


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
            session.execute(
                text(
                    "INSERT INTO campaign_generations (campaign_id, generation) "
                    "VALUES (:c, :g) ON CONFLICT DO NOTHING"
                ),
                {"c": campaign_id, "g": generation + 1},
            )
            session.execute(
                text(
                    "UPDATE campaigns SET current_generation = :next "
                    "WHERE id = :c AND current_generation = :g"
                ),
                {"c": campaign_id, "g": generation, "next": generation + 1},
            )
    return won is not None


def assign(campaign_id: str, chunk_no: int, size: int, capacity: int) -> tuple[int, list[int]]:
    """The chunk's generation, and the generations this call closed on overflow."""
    existing = assigned_generation(campaign_id, chunk_no)
    if existing is not None:
        return existing, []
    closed_here: list[int] = []
    while True:
        generation, assigned = _approve(campaign_id, chunk_no, size, capacity)
        if assigned:
            return generation, closed_here
        if readiness(campaign_id, generation).closed:
            continue  # someone already rolled over: try the new current generation
        if not close(campaign_id, generation, open_next=True):
            raise Rollover(f"generation {generation} is being closed by another chunk")
        closed_here.append(generation)


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
    """The chunk's load record, written only after every message was accepted."""
    with transaction() as session:
        recorded = session.execute(
            text(
                "UPDATE campaign_chunks SET loaded_at = clock_timestamp() "
                "WHERE campaign_id = :c AND chunk_no = :k AND loaded_at IS NULL RETURNING 1"
            ),
            {"c": campaign_id, "k": chunk_no},
        ).first()
        session.execute(
            text(
                "INSERT INTO campaign_watch (campaign_id, last_load_at) "
                "VALUES (:c, clock_timestamp()) ON CONFLICT (campaign_id) "
                "DO UPDATE SET last_load_at = EXCLUDED.last_load_at"
            ),
            {"c": campaign_id},
        )
    return recorded is not None


def readiness(campaign_id: str, generation: int) -> Readiness:
    with transaction() as session:
        row = session.execute(
            text(
                """
                SELECT g.closed, g.group_id, g.sent_at IS NOT NULL AS sent,
                       count(c.chunk_no) AS assigned, count(c.loaded_at) AS loaded
                FROM campaign_generations g
                LEFT JOIN campaign_chunks c
                       ON c.campaign_id = g.campaign_id AND c.generation = g.generation
                WHERE g.campaign_id = :c AND g.generation = :g
                GROUP BY g.closed, g.group_id, g.sent_at
                """
            ),
            {"c": campaign_id, "g": generation},
        ).one()
    return Readiness(row.closed, row.assigned, row.loaded, row.group_id, row.sent)


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
    with transaction() as session:
        missing = session.execute(
            text(
                "SELECT count(*) FROM campaign_chunks WHERE campaign_id = :c AND loaded_at IS NULL"
            ),
            {"c": campaign_id},
        ).scalar_one()
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

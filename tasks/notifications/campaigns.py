"""Campaigns: creation, recipients, chunks, the report, the monitor and the status view."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text

from tasks.jobs import JobNotFound, Owner
from tasks.jobs.intake import webhook_events
from tasks.jobs.observe import events
from tasks.jobs.observe.queries import iso
from tasks.notifications import generations, templates
from tasks.notifications.models import (
    Campaign,
    CampaignGeneration,
    CampaignRecipient,
)
from tasks.platform.config import get_settings
from tasks.platform.db import transaction

log = logging.getLogger(__name__)
EVENTS_QUEUE = "notifications"
BATCH = 1000

__all__ = ["Campaign", "get", "get_owned", "list_owned"]


def owner(campaign: Campaign) -> Owner:
    return Owner(campaign.tenant_id, campaign.user_id)


def get(campaign_id: str) -> Campaign:
    with transaction() as session:
        campaign = session.get(Campaign, campaign_id)
    if campaign is None:
        raise JobNotFound("campaign not found")
    return campaign


def get_owned(campaign_id: str, who: Owner, *, tenant_wide: bool = False) -> Campaign:
    """The campaign if ``who`` may see it (``tenant_wide``: any of its tenant's, for operators);
    anything else looks exactly like a missing one."""
    with transaction() as session:
        campaign = session.get(Campaign, campaign_id)
    if campaign is None or campaign.tenant_id != who.tenant_id:
        raise JobNotFound("campaign not found")
    if not tenant_wide and campaign.user_id != who.user_id:
        raise JobNotFound("campaign not found")
    return campaign


def list_owned(who: Owner, *, tenant_wide: bool = False, limit: int = 50) -> list[Campaign]:
    """The newest campaigns ``who`` may see: its own, or (``tenant_wide``) its tenant's."""
    query = select(Campaign).where(Campaign.tenant_id == who.tenant_id)
    if not tenant_wide:
        query = query.where(Campaign.user_id == who.user_id)
    query = query.order_by(Campaign.created_at.desc(), Campaign.id.desc()).limit(limit)
    with transaction() as session:
        return list(session.scalars(query))


@dataclass(frozen=True)
class ChunkState:
    """A chunk as its loader sees it: the campaign's fields that make its messages, its
    size, its generation (if assigned), that generation's group (if made), and whether
    its load is recorded."""

    campaign: Campaign
    size: int
    generation: int | None
    group_id: str | None
    loaded: bool


_CHUNK_CAMPAIGN_FIELDS = (
    "id",
    "tenant_id",
    "user_id",
    "name",
    "category",
    "template",
    "recipient_count",
    "synthetic",
    "chunk_size",
    "chunk_count",
    "capacity",
)


_CHUNK_STATE = text(
    f"""
    SELECT {", ".join(f"c.{name}" for name in _CHUNK_CAMPAIGN_FIELDS)},
           k.size, k.generation, g.group_id, k.loaded_at IS NOT NULL AS loaded
    FROM campaign_chunks k
    JOIN campaigns c ON c.id = k.campaign_id
    LEFT JOIN campaign_generations g
           ON g.campaign_id = k.campaign_id AND g.generation = k.generation
    WHERE k.campaign_id = :c AND k.chunk_no = :k
    """
)


def chunk_state(campaign_id: str, chunk_no: int) -> ChunkState:
    """One statement: the campaign's fields, the chunk, and its generation's group."""
    with transaction(one_statement=True) as session:
        row = session.execute(_CHUNK_STATE, {"c": campaign_id, "k": chunk_no}).first()
    if row is None:
        raise JobNotFound(f"chunk {chunk_no} of campaign {campaign_id} not planned")
    campaign = Campaign(**{name: getattr(row, name) for name in _CHUNK_CAMPAIGN_FIELDS})
    return ChunkState(campaign, row.size, row.generation, row.group_id, row.loaded)


def create_chunks(campaign: Campaign) -> None:
    """The campaign's chunk rows, and its first generation's (approvals count there)."""
    with transaction() as session:
        generations.open_in(session, campaign.id, 0)
        session.execute(
            text(
                """
                INSERT INTO campaign_chunks (campaign_id, chunk_no, size)
                SELECT :c, k, LEAST(:size, :n - k * :size)
                FROM generate_series(0, :chunks - 1) AS k
                ON CONFLICT DO NOTHING
                """
            ),
            {
                "c": campaign.id,
                "size": campaign.chunk_size,
                "n": campaign.recipient_count,
                "chunks": campaign.chunk_count,
            },
        )


def _recipients(campaign: Campaign, first: int, last: int) -> list[tuple[int, str, dict]]:
    if campaign.synthetic:
        return [(seq, f"+82-10-{seq:08d}", {"seq": seq}) for seq in range(first, last)]
    with transaction() as session:
        rows = session.execute(
            select(CampaignRecipient.seq, CampaignRecipient.to, CampaignRecipient.vars)
            .where(
                CampaignRecipient.campaign_id == campaign.id,
                CampaignRecipient.seq >= first,
                CampaignRecipient.seq < last,
            )
            .order_by(CampaignRecipient.seq)
        ).all()
    return [(r.seq, r.to, r.vars) for r in rows]


def _messages(campaign: Campaign, chunk_no: int) -> Iterator[dict[str, str]]:
    """The chunk's messages, rendered one at a time; ids are stable."""
    first = chunk_no * campaign.chunk_size
    last = min(campaign.recipient_count, first + campaign.chunk_size)
    for start in range(first, last, BATCH):
        for seq, to, values in _recipients(campaign, start, min(last, start + BATCH)):
            yield {
                "messageId": f"{campaign.id}:{seq}",
                "to": to,
                "text": templates.render(campaign.template, values),
            }


def message_batches(campaign: Campaign, chunk_no: int) -> Iterator[list[dict[str, str]]]:
    """The chunk's provider requests, bounded in count and in text (``templates.batches``)."""
    return templates.batches(_messages(campaign, chunk_no))


def _summary(campaign_id: str) -> dict[str, Any]:
    with transaction() as session:
        gens = session.scalars(
            select(CampaignGeneration)
            .where(CampaignGeneration.campaign_id == campaign_id)
            .order_by(CampaignGeneration.generation)
        ).all()
        chunks = session.execute(
            text(
                "SELECT generation, count(*) AS chunks, sum(size) AS messages, "
                "count(loaded_at) AS loaded FROM campaign_chunks WHERE campaign_id = :c "
                "GROUP BY generation"
            ),
            {"c": campaign_id},
        ).all()
    per_gen = {row.generation: row for row in chunks}
    return {
        "generations": [
            {
                "generation": g.generation,
                "groupId": g.group_id,
                "closed": g.closed,
                "sent": g.sent_at is not None,
                "sentAt": iso(g.sent_at),
                "chunks": per_gen[g.generation].chunks if g.generation in per_gen else 0,
                "messages": int(per_gen[g.generation].messages or 0)
                if g.generation in per_gen
                else 0,
            }
            for g in gens
        ],
        "chunks": {
            "planned": sum(r.chunks for r in chunks),
            "assigned": sum(r.chunks for r in chunks if r.generation is not None),
            "loaded": sum(r.loaded for r in chunks),
        },
    }


def maybe_report(campaign_id: str) -> bool:
    """Emit the campaign report once: when every chunk is loaded and every generation sent."""
    summary = _summary(campaign_id)
    gens = [g for g in summary["generations"] if g["chunks"]]  # none prepared but unused
    chunks = summary["chunks"]
    if not gens or chunks["loaded"] != chunks["planned"] or not all(g["sent"] for g in gens):
        return False
    report = {
        "generations": len(gens),
        "messages": sum(g["messages"] for g in gens),
        "groups": [g["groupId"] for g in gens],
    }
    with transaction() as session:
        won = session.execute(
            text(
                "UPDATE campaigns SET reported_at = clock_timestamp(), "
                "report = CAST(:r AS jsonb), stalled_at = NULL "
                "WHERE id = :c AND reported_at IS NULL RETURNING id, tenant_id"
            ),
            {"c": campaign_id, "r": json.dumps(report)},
        ).first()
        if won:
            session.execute(
                text("DELETE FROM campaign_watch WHERE campaign_id = :c"), {"c": campaign_id}
            )
            finished = {"campaignId": campaign_id, "report": report}
            webhook_events.post(session, won.tenant_id, "campaign.finished", finished, campaign_id)
    if won:
        log.info("campaign %s report: %s", campaign_id, report)
        events.emit(
            EVENTS_QUEUE,
            "campaign.report",
            campaign_id,
            "campaign",
            report=report,
            tenant=won.tenant_id,
        )
    return won is not None


def watch(quiet_seconds: float | None = None) -> dict[str, Any]:
    """The monitor: flag quiet unfinished campaigns; drop entries of finished ones."""
    quiet = quiet_seconds or get_settings().campaign_quiet_s
    with transaction() as session:
        healed = (
            session.execute(
                text(
                    "DELETE FROM campaign_watch w USING campaigns c WHERE c.id = w.campaign_id "
                    "AND c.reported_at IS NOT NULL RETURNING w.campaign_id"
                )
            )
            .scalars()
            .all()
        )
        stalled = session.execute(
            text(
                "UPDATE campaigns c SET stalled_at = clock_timestamp() FROM campaign_watch w "
                "WHERE c.id = w.campaign_id AND c.reported_at IS NULL AND c.stalled_at IS NULL "
                "AND w.last_load_at < clock_timestamp() - make_interval(secs => :q) "
                "RETURNING c.id, c.tenant_id"
            ),
            {"q": quiet},
        ).all()
        session.execute(
            text(
                "UPDATE campaigns c SET stalled_at = NULL FROM campaign_watch w "
                "WHERE c.id = w.campaign_id AND c.stalled_at IS NOT NULL "
                "AND w.last_load_at >= clock_timestamp() - make_interval(secs => :q)"
            ),
            {"q": quiet},
        )
    for campaign_id, tenant in stalled:
        log.error("campaign %s made no progress for %ss", campaign_id, quiet)
        events.emit(
            EVENTS_QUEUE,
            "campaign.stalled",
            campaign_id,
            "campaign",
            quietSeconds=quiet,
            tenant=tenant,
        )
    return {"stalled": [campaign_id for campaign_id, _ in stalled], "healed": list(healed)}


def describe(campaign: Campaign) -> dict[str, Any]:
    summary = _summary(campaign.id)
    state = (
        "completed"
        if campaign.reported_at
        else ("sending" if summary["chunks"]["loaded"] == campaign.chunk_count else "loading")
    )
    return {
        "campaignId": campaign.id,
        "name": campaign.name,
        "category": campaign.category,
        "state": state,
        "recipients": campaign.recipient_count,
        "chunkSize": campaign.chunk_size,
        "chunks": summary["chunks"],
        "generations": summary["generations"],
        "messages": {
            "planned": campaign.recipient_count,
            "sent": sum(g["messages"] for g in summary["generations"] if g["sent"]),
        },
        "report": campaign.report,
        "stalled": campaign.stalled_at is not None,
        "createdAt": iso(campaign.created_at),
    }

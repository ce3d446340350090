"""Campaign state in Postgres: recipients, chunks, generations and the watch list.

Such group sends usually settle their races with Redis ``SET NX`` and ``HINCRBY``. Keel keeps
the same first-writer-wins and never-given-back counter semantics, but as
single-row atomic statements in Postgres (``UPDATE ... WHERE group_id IS
NULL RETURNING``, ``approved = approved + n RETURNING``), so a Redis restart
without persistence cannot forget which group a generation owns or that it
was already sent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Index, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tasks.platform.db import Base


class Campaign(Base):
    """One template sent to many recipients through provider groups."""

    __tablename__ = "campaigns"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(200))
    user_id: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(100))
    template: Mapped[str] = mapped_column(Text)
    recipient_count: Mapped[int] = mapped_column(Integer)
    synthetic: Mapped[bool] = mapped_column(Boolean)
    chunk_size: Mapped[int] = mapped_column(Integer)
    chunk_count: Mapped[int] = mapped_column(Integer)
    capacity: Mapped[int] = mapped_column(Integer)
    current_generation: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    stalled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    report: Mapped[dict[str, Any] | None] = mapped_column(JSONB)

    __table_args__ = (Index("ix_campaigns_owner", "tenant_id", "user_id"),)


class CampaignRecipient(Base):
    """A recipient given in the request (synthetic campaigns store none)."""

    __tablename__ = "campaign_recipients"

    campaign_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    to: Mapped[str] = mapped_column(String(200))
    vars: Mapped[dict[str, Any]] = mapped_column(JSONB)


class CampaignChunk(Base):
    """A range of recipients: its generation (recorded before loading) and its load record."""

    __tablename__ = "campaign_chunks"

    campaign_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    chunk_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    generation: Mapped[int | None] = mapped_column(Integer)
    assigned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    loaded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CampaignGeneration(Base):
    """One provider group's worth of a campaign."""

    __tablename__ = "campaign_generations"

    campaign_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, primary_key=True)
    group_id: Mapped[str | None] = mapped_column(String(200))
    approved: Mapped[int] = mapped_column(Integer, server_default="0")
    closed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CampaignWatch(Base):
    """The monitor's heartbeat entry: last load time of an unfinished campaign."""

    __tablename__ = "campaign_watch"

    campaign_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_load_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class GroupAttempt(Base):
    """A group-creation attempt, recorded before the provider is called.

    Its idempotency key finds the group it made (if any) again, so a creator
    that died or lost the race can still have its empty group removed.
    """

    __tablename__ = "campaign_group_attempts"

    campaign_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(300), primary_key=True)

"""Report artifacts: stored once per operation key."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from tasks.platform.db import Base


class ReportArtifact(Base):
    """The generated report of one operation key (unique)."""

    __tablename__ = "report_artifacts"

    operation_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(200))
    report_id: Mapped[str] = mapped_column(String(200))
    object_key: Mapped[str] = mapped_column(String(400))
    generated_rows: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )

"""The artifact store: one row per operation key, written with ``INSERT ... ON CONFLICT``.

Looking up first spares the work on a re-run; the conflict clause settles
the race when two workers generate the same report at once — both return
the one stored row.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from tasks.platform.db import affected
from tasks.reports.models import ReportArtifact


def as_result(artifact: ReportArtifact, *, reused: bool) -> dict:
    return {
        "operationKey": artifact.operation_key,
        "reportId": artifact.report_id,
        "objectKey": artifact.object_key,
        "generatedRows": artifact.generated_rows,
        "reused": reused,
    }


def find(session: Session, operation_key: str) -> ReportArtifact | None:
    return session.get(ReportArtifact, operation_key)


def save_once(session: Session, artifact: ReportArtifact) -> tuple[ReportArtifact, bool]:
    """Store ``artifact`` unless its key exists; returns the stored row and whether it was ours."""
    values = {
        "operation_key": artifact.operation_key,
        "tenant_id": artifact.tenant_id,
        "report_id": artifact.report_id,
        "object_key": artifact.object_key,
        "generated_rows": artifact.generated_rows,
        "job_id": artifact.job_id,
    }
    inserted = session.execute(
        insert(ReportArtifact)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["operation_key"])
        .returning(ReportArtifact.operation_key)
    ).first()
    stored = session.get(ReportArtifact, artifact.operation_key, populate_existing=True)
    assert stored is not None
    return stored, inserted is not None


def remove_older_than(session: Session, keep_days: int) -> int:
    cutoff = func.now() - timedelta(days=keep_days)
    result = session.execute(delete(ReportArtifact).where(ReportArtifact.created_at < cutoff))
    return affected(result)


def count(session: Session, operation_key: str) -> int:
    return (
        session.scalar(select(func.count()).where(ReportArtifact.operation_key == operation_key))
        or 0
    )

"""Every table Keel owns, imported in one place for Alembic."""

from __future__ import annotations

from tasks.jobs.model.models import (
    ArchivedJob,
    DedupClaim,
    JobCount,
    JobCountDelta,
    JobRecord,
    JobSchedulerRecord,
    RetryAudit,
)
from tasks.notifications.models import (
    Campaign,
    CampaignChunk,
    CampaignGeneration,
    CampaignRecipient,
    CampaignWatch,
    GroupAttempt,
)
from tasks.platform.db import Base
from tasks.reports.models import ReportArtifact

metadata = Base.metadata

__all__ = [
    "ArchivedJob",
    "Campaign",
    "CampaignChunk",
    "CampaignGeneration",
    "CampaignRecipient",
    "CampaignWatch",
    "DedupClaim",
    "GroupAttempt",
    "JobCount",
    "JobCountDelta",
    "JobRecord",
    "JobSchedulerRecord",
    "ReportArtifact",
    "RetryAudit",
    "metadata",
]

"""What the API asks of campaigns: create, look up, resume."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import insert, text

from tasks.config import get_settings
from tasks.db import transaction
from tasks.jobs import JobOptions, Owner, add
from tasks.jobs.errors import InvalidJobState
from tasks.jobs.models import JobRecord
from tasks.jobs.producer import new_job_id
from tasks.jobs.recovery import RetryRequest, retry_failed
from tasks.notifications import campaigns, generations, jobs
from tasks.notifications.models import Campaign, CampaignRecipient

DEFAULT_CHUNK = 5000


@dataclass(frozen=True)
class NewCampaign:
    name: str
    category: str
    template: str
    recipients: list[dict] | None
    recipient_count: int | None
    chunk_size: int | None


def create(who: Owner, spec: NewCampaign) -> Campaign:
    """Store the campaign and its recipients, then enqueue its plan job."""
    capacity = get_settings().provider_capacity
    count = len(spec.recipients) if spec.recipients is not None else spec.recipient_count
    assert count
    chunk_size = min(spec.chunk_size or DEFAULT_CHUNK, capacity)
    campaign = Campaign(
        id=new_job_id(), tenant_id=who.tenant_id, user_id=who.user_id, name=spec.name,
        category=spec.category, template=spec.template, recipient_count=count,
        synthetic=spec.recipients is None, chunk_size=chunk_size,
        chunk_count=math.ceil(count / chunk_size), capacity=capacity, current_generation=0,
    )  # fmt: skip
    with transaction() as session:
        session.add(campaign)
        session.flush()
        if spec.recipients:
            session.execute(insert(CampaignRecipient), [
                {"campaign_id": campaign.id, "seq": seq, "to": r["to"], "vars": r.get("vars", {})}
                for seq, r in enumerate(spec.recipients)])  # fmt: skip
        session.execute(text("INSERT INTO campaign_watch (campaign_id, last_load_at) "
                             "VALUES (:c, clock_timestamp())"), {"c": campaign.id})  # fmt: skip
    add(jobs.PLAN, {"campaignId": campaign.id}, queue=jobs.QUEUE, owner=who,
        opts=JobOptions(jobId=f"{jobs.PLAN}:{campaign.id}", attempts=5))  # fmt: skip
    return campaign


def _unfinished_chunk_jobs(campaign: Campaign) -> list[tuple[int, JobRecord | None]]:
    with transaction() as session:
        missing = session.execute(text(
            "SELECT chunk_no FROM campaign_chunks WHERE campaign_id = :c AND loaded_at IS NULL "
            "ORDER BY chunk_no"), {"c": campaign.id}).scalars().all()  # fmt: skip
        return [(k, session.get(JobRecord, jobs.chunk_job_id(campaign.id, k))) for k in missing]


def _requeue(job: JobRecord, actor: str) -> None:
    """Operator-authorised retry of an internal job (the campaign's owner was checked)."""
    request = RetryRequest(
        job_id=job.id,
        queue=job.queue,
        owner=Owner(job.tenant_id, job.user_id),
        actor=actor,
        reason="campaign resume: re-dispatching what did not finish",
    )
    retry_failed(request, audit_ids=lambda j: {"jobId": j.id, **j.data},
                 conflicts=lambda session, j: None)  # fmt: skip


def resume(who: Owner, campaign_id: str, actor: str) -> dict:
    """Re-dispatch unloaded chunks, unsent generations and a finalize; every step idempotent."""
    campaign = campaigns.get_owned(campaign_id, who)
    if campaign.reported_at is not None:
        raise InvalidJobState("the campaign is already complete")
    owner = campaigns.owner(campaign)
    requeued = 0
    for chunk_no, job in _unfinished_chunk_jobs(campaign):
        if job is None:
            add(jobs.LOAD, {"campaignId": campaign.id, "chunk": chunk_no}, queue=jobs.QUEUE,
                owner=owner, opts=jobs.CHUNK_OPTS.model_copy(
                    update={"job_id": jobs.chunk_job_id(campaign.id, chunk_no)}))  # fmt: skip
            requeued += 1
        elif job.state == "failed":
            _requeue(job, actor)
            requeued += 1
    for generation in generations.generations(campaign.id):
        ready = generations.readiness(campaign.id, generation)
        send_job = _job(f"{jobs.SEND}:{ready.group_id}") if ready.group_id else None
        if send_job is not None and send_job.state == "failed" and not ready.sent:
            _requeue(send_job, actor)
    add(jobs.FINALIZE, {"campaignId": campaign.id}, queue=jobs.QUEUE, owner=owner,
        opts=JobOptions(jobId=f"{jobs.FINALIZE}:{campaign.id}:{new_job_id()}"))  # fmt: skip
    return {"campaignId": campaign.id, "requeuedChunks": requeued}


def _job(job_id: str) -> JobRecord | None:
    with transaction() as session:
        return session.get(JobRecord, job_id)

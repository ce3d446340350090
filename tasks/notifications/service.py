"""What the API asks of campaigns: create, look up, resume."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import insert, text
from sqlalchemy.orm import Session

from tasks.jobs import JobOptions, Owner, add, in_transaction
from tasks.jobs.intake import tenancy
from tasks.jobs.intake.enqueue import new_job_id
from tasks.jobs.intake.manual_retry import RetryRequest, retry_failed
from tasks.jobs.model.errors import InvalidJobState, LimitExceeded
from tasks.jobs.model.models import JobRecord
from tasks.jobs.observe.queries import get as get_job
from tasks.notifications import campaigns, generations, jobs, templates
from tasks.notifications.models import Campaign, CampaignRecipient
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.quotas import TenantQuotas

DEFAULT_CHUNK = 5000


@dataclass(frozen=True)
class NewCampaign:
    name: str
    category: str
    template: str
    recipients: list[dict] | None
    recipient_count: int | None
    chunk_size: int | None


def _longest_message(spec: NewCampaign, count: int) -> int:
    if spec.recipients is not None:
        return templates.longest(spec.template, (r.get("vars", {}) for r in spec.recipients))
    return templates.longest(spec.template, [{"seq": count - 1}])  # synthetic: {seq} only


def _check_shape(spec: NewCampaign, count: int, quota: TenantQuotas) -> None:
    """Shape limits (400): plain placeholders, the provider's message length, and chunks
    that are not too small."""
    try:
        templates.plain(spec.template)
    except ValueError as exc:
        raise LimitExceeded(
            f"template placeholders: {exc}",
            details=[{"field": "template", "limit": "placeholders"}],
        ) from None
    longest = _longest_message(spec, count)
    if longest > templates.MAX_TEXT_LENGTH:
        raise LimitExceeded(
            f"the longest message would be {longest} characters; the provider takes at most "
            f"{templates.MAX_TEXT_LENGTH}",
            details=[
                {
                    "field": "template",
                    "limit": "maxMessageLength",
                    "max": templates.MAX_TEXT_LENGTH,
                    "longest": longest,
                }
            ],
        )
    if spec.chunk_size is not None and spec.chunk_size < quota.min_chunk_size:
        raise LimitExceeded(
            f"chunkSize must be at least {quota.min_chunk_size}",
            details=[{"field": "chunkSize", "limit": "minChunkSize", "min": quota.min_chunk_size}],
        )


def _check_recipients(session: Session, who: Owner, count: int, limit: int) -> None:
    """The tenant's recipients in unfinished campaigns stay within ``limit`` (429)."""
    tenancy.lock(session, who.tenant_id, "campaigns")
    held = session.execute(
        text(
            "SELECT COALESCE(sum(recipient_count), 0) FROM campaigns "
            "WHERE tenant_id = :t AND reported_at IS NULL"
        ),
        {"t": who.tenant_id},
    ).scalar_one()
    if held + count > limit:
        raise tenancy.exceeded(
            "campaignRecipients",
            limit,
            int(held),
            f"the tenant's unfinished campaigns hold {held} recipients; "
            f"{count} more would pass its quota of {limit}",
        )


def create(who: Owner, spec: NewCampaign, quota: TenantQuotas | None = None) -> Campaign:
    """Store the campaign, its recipients and its plan job in one transaction (the plan is
    published once it commits): a campaign is never stored without its plan.

    ``quota`` (the API passes the tenant's) refuses a campaign whose messages the
    provider would refuse, chunks that are too small, or recipients past the quota.
    """
    capacity = get_settings().provider_capacity
    count = len(spec.recipients) if spec.recipients is not None else spec.recipient_count
    assert count
    if quota is not None:
        _check_shape(spec, count, quota)
    chunk_size = min(spec.chunk_size or DEFAULT_CHUNK, capacity)
    campaign = Campaign(
        id=new_job_id(),
        tenant_id=who.tenant_id,
        user_id=who.user_id,
        name=spec.name,
        category=spec.category,
        template=spec.template,
        recipient_count=count,
        synthetic=spec.recipients is None,
        chunk_size=chunk_size,
        chunk_count=math.ceil(count / chunk_size),
        capacity=capacity,
        current_generation=0,
    )
    with transaction() as session:
        if quota is not None:
            _check_recipients(session, who, count, quota.campaign_recipients)
        session.add(campaign)
        session.flush()
        if spec.recipients:
            session.execute(
                insert(CampaignRecipient),
                [
                    {
                        "campaign_id": campaign.id,
                        "seq": seq,
                        "to": r["to"],
                        "vars": r.get("vars", {}),
                    }
                    for seq, r in enumerate(spec.recipients)
                ],
            )
        session.execute(
            text(
                "INSERT INTO campaign_watch (campaign_id, last_load_at) "
                "VALUES (:c, clock_timestamp())"
            ),
            {"c": campaign.id},
        )
        # Its plan job is recorded in the same transaction, so a campaign is never stored
        # without one (a store error there fails the whole request, which may be retried).
        with in_transaction(session):
            add(
                jobs.PLAN,
                {"campaignId": campaign.id},
                queue=jobs.QUEUE,
                owner=who,
                opts=JobOptions(job_id=f"{jobs.PLAN}:{campaign.id}", attempts=5),
            )
    return campaign


def _unfinished_chunk_jobs(campaign: Campaign) -> list[tuple[int, JobRecord | None]]:
    with transaction() as session:
        missing = (
            session.execute(
                text(
                    "SELECT chunk_no FROM campaign_chunks "
                    "WHERE campaign_id = :c AND loaded_at IS NULL ORDER BY chunk_no"
                ),
                {"c": campaign.id},
            )
            .scalars()
            .all()
        )
    return [(k, get_job(jobs.chunk_job_id(campaign.id, k))) for k in missing]


# How an internal job of the campaign ended without doing its part: a resume runs it again.
ENDED_UNDONE = ("failed", "cancelled")


def _requeue(job: JobRecord, actor: str) -> None:
    """Operator-authorised retry of an internal job (the campaign's owner was checked); a
    cancelled one too: resuming the campaign is the operator's decision to run it again."""
    request = RetryRequest(
        cancelled_too=True,
        job_id=job.id,
        queue=job.queue,
        owner=None,  # the campaign's owner was checked: its internal jobs follow
        actor=actor,
        reason="campaign resume: re-dispatching what did not finish",
    )
    retry_failed(
        request, audit_ids=lambda j: {"jobId": j.id, **j.data}, conflicts=lambda session, j: None
    )


def resume(who: Owner, campaign_id: str, actor: str) -> dict:
    """Re-dispatch unloaded chunks, unsent generations and a finalize; every step idempotent.

    An operator's action: any campaign of the operator's tenant."""
    campaign = campaigns.get_owned(campaign_id, who, tenant_wide=True)
    if campaign.reported_at is not None:
        raise InvalidJobState("the campaign is already complete")
    owner = campaigns.owner(campaign)
    requeued = 0
    for generation in generations.generations(campaign.id):
        ready = generations.readiness(campaign.id, generation)
        creator = get_job(jobs.create_job_id(campaign.id, generation))
        if ready.group_id is None and creator is not None and creator.state in ENDED_UNDONE:
            _requeue(creator, actor)  # before the chunks that wait for its group
        send_job = get_job(f"{jobs.SEND}:{ready.group_id}") if ready.group_id else None
        if send_job is not None and send_job.state in ENDED_UNDONE and not ready.sent:
            _requeue(send_job, actor)
    for chunk_no, job in _unfinished_chunk_jobs(campaign):
        if job is None:
            add(
                jobs.LOAD,
                {"campaignId": campaign.id, "chunk": chunk_no},
                queue=jobs.QUEUE,
                owner=owner,
                opts=jobs.provider_options(jobs.chunk_job_id(campaign.id, chunk_no)),
            )
            requeued += 1
        elif job.state in ENDED_UNDONE:
            _requeue(job, actor)
            requeued += 1
    add(
        jobs.FINALIZE,
        {"campaignId": campaign.id},
        queue=jobs.QUEUE,
        owner=owner,
        opts=JobOptions(job_id=f"{jobs.FINALIZE}:{campaign.id}:{new_job_id()}"),
    )
    return {"campaignId": campaign.id, "requeuedChunks": requeued}

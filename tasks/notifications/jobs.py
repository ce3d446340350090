"""Handlers of the ``notifications`` queue: plan, load chunks, create and send groups.

Every provider call happens inside a job, so retries, backoff, records and
the queue's global limits apply to all of them.
"""

from __future__ import annotations

import logging
import os
import threading

from celery import chord, current_app

from tasks.jobs import (
    Backoff,
    JobContext,
    JobOptions,
    UnrecoverableError,
    acting_as,
    add,
    handler,
    recorded_together,
)
from tasks.jobs.model.errors import ControlFlow, Defer, Unavailable
from tasks.jobs.observe.queries import get as get_job
from tasks.notifications import campaigns, generations
from tasks.notifications.generations import Rollover
from tasks.notifications.provider import GroupConflict, ProviderClient, ProviderRejected
from tasks.platform.config import get_settings

log = logging.getLogger(__name__)
QUEUE = "notifications"
PLAN = "campaign.plan"
LOAD = "campaign.load_chunk"
CREATE = "group.create"
SEND = "group.send"
FINALIZE = "campaign.finalize"
MONITOR = "campaign.monitor"


def provider_options(job_id: str) -> JobOptions:
    """Options of a job that calls the provider: its attempts and backoff are settings."""
    settings = get_settings()
    backoff = Backoff(type="exponential", delay=settings.provider_retry_delay_ms, jitter=0.5)
    return JobOptions(
        job_id=job_id,
        attempts=settings.provider_retry_attempts,
        backoff=backoff,
        remove_on_complete=1000,
    )


SEND_OPTS = JobOptions(attempts=10, backoff=Backoff(type="exponential", delay=1000, jitter=0.5))
# A chunk waiting for its group's creator is woken by the creator's end; this backstop
# (growing with each look, up to the max) only covers a lost wake-up.
GROUP_WAIT_MS = 1000
GROUPS_AHEAD = 2  # generations whose groups are made before their first chunk arrives
GROUP_WAIT_MAX_MS = 15_000
ROLLOVER_WAIT_MS = 100


class Stragglers(ControlFlow):
    """A chunk assigned to this generation is still loading; the send waits for it."""

    code = "stragglers"


class GroupUnavailable(Unavailable):
    """The generation's group creator failed for good; the chunk cannot load (yet)."""

    code = "group_unavailable"


_clients = threading.local()


def _provider() -> ProviderClient:
    """This thread's client of the configured provider: its connections are reused from
    one job to the next (a campaign's chunk makes several requests, and there are hundreds).
    A process forked from this one, or a changed provider URL, gets a new one."""
    key = (os.getpid(), get_settings().provider_url)
    if getattr(_clients, "key", None) != key:
        _clients.key, _clients.client = key, ProviderClient.from_settings()
    client: ProviderClient = _clients.client
    return client


def chunk_job_id(campaign_id: str, chunk_no: int) -> str:
    return f"campaign.chunk:{campaign_id}:{chunk_no}"


@handler(PLAN, queue=QUEUE)
def plan_campaign(job: JobContext) -> dict:
    """Split the campaign into chunks and fan them in with a chord.

    The chord's chunk jobs are recorded in one statement and published in one
    pipeline (``recorded_together``), owned by the campaign's owner. They queue
    behind what their tenant already has on the queue, like any burst of adds
    (``tasks.jobs.intake.tenancy``): a big campaign does not hold others up, and the
    campaign's control jobs (group creation, sends, the finalizer) go ahead of its
    own chunks. They were admitted with the campaign (its recipients quota), so the
    live-jobs quota does not refuse them here. A re-run of the plan names the same
    chunk jobs: those already recorded are only woken if still waiting.
    """
    campaign = campaigns.get(job.data["campaignId"])
    campaigns.create_chunks(campaign)
    for generation in range(GROUPS_AHEAD):
        prepare_group(campaign, generation)
    owner = campaigns.owner(campaign)
    header = []
    for chunk_no in range(campaign.chunk_count):
        data = {"campaignId": campaign.id, "chunk": chunk_no}
        job_id = chunk_job_id(campaign.id, chunk_no)
        options = {"job_options": provider_options(job_id).stored()}
        header.append(
            current_app.signature(LOAD, kwargs=data, task_id=job_id, queue=QUEUE, **options)
        )
    finalize_id = f"{FINALIZE}:{campaign.id}:plan-{job.attempts_started}"
    add(
        FINALIZE,
        {"campaignId": campaign.id},
        queue=QUEUE,
        owner=owner,
        opts=JobOptions(job_id=finalize_id),
        publish_now=False,
    )
    # Immutable (``.si()``): the finalizer reads the campaign's records, not the chunks'
    # results. Its job is recorded above, so the chord is counted by Celery's backend
    # (``tasks.jobs.end.canvas.open_chord``), which calls a mutable body with the results as
    # a positional argument: refused by a task that takes its data as keyword arguments.
    body = current_app.signature(
        FINALIZE,
        kwargs={"campaignId": campaign.id},
        task_id=finalize_id,
        queue=QUEUE,
        immutable=True,
    )
    with acting_as(owner), recorded_together(quota=False):
        chord(header)(body)
    return {"chunks": campaign.chunk_count}


@handler(LOAD, queue=QUEUE)
def load_chunk(job: JobContext) -> dict:
    """Load one chunk into its generation's group, then see what became sendable."""
    campaign_id, chunk_no = job.data["campaignId"], job.data["chunk"]
    state = campaigns.chunk_state(campaign_id, chunk_no)
    if state.loaded:  # a duplicate delivery or a resumed chunk
        after_load(campaign_id, state.generation)
        return {"generation": state.generation, "alreadyLoaded": True}
    generation, group_id = state.generation, state.group_id
    if generation is None:
        try:
            approval, closed = generations.assign(
                campaign_id,
                chunk_no,
                state.size,
                state.campaign.capacity,
                before_close=lambda full: prepare_group(state.campaign, full + GROUPS_AHEAD),
            )
        except Rollover:
            raise Defer(ROLLOVER_WAIT_MS, "joining the next generation") from None
        for full in closed:
            maybe_send(campaign_id, full)
        generation, group_id = approval.generation, approval.group_id
    if group_id is None:
        group_id = _await_group(job, campaign_id, generation)
    loaded = _load_messages(state.campaign, chunk_no, group_id)
    generations.record_load(campaign_id, chunk_no)
    after_load(campaign_id, generation)
    return {"generation": generation, "groupId": group_id, "messages": loaded}


def prepare_group(campaign: campaigns.Campaign, generation: int) -> None:
    """Queue the creator of a generation's group before any chunk is assigned to it, if
    the campaign is sure to reach that generation.

    Each generation holds at most ``capacity`` messages, so one numbered ``g`` is reached
    whenever the campaign has more than ``g * capacity`` recipients. The plan prepares the
    first ``GROUPS_AHEAD``; a chunk about to close generation ``g`` prepares ``g +
    GROUPS_AHEAD`` before the close commits, so before ``g + 1`` opens: however many
    chunks run at once, none is assigned to ``g + GROUPS_AHEAD`` before its creator is
    recorded. Its chunks then find the group made, instead of each generation's
    first chunk adding the creator and waiting for it (``_await_group``, still the way
    for a generation the count did not foresee). The creator is a control job: it runs
    ahead of the queue's chunks.
    """
    if generation * campaign.capacity >= campaign.recipient_count:
        return
    add(
        CREATE,
        {"campaignId": campaign.id, "generation": generation},
        queue=QUEUE,
        opts=provider_options(create_job_id(campaign.id, generation)),
    )


def create_job_id(campaign_id: str, generation: int) -> str:
    """One creator job per generation: its retries reuse one idempotency key, so one group."""
    return f"{CREATE}:{campaign_id}:{generation}"


def _await_group(job: JobContext, campaign_id: str, generation: int) -> str:
    """Make sure the generation's creator exists, then wait for its group without an attempt.

    The creator is a control job: it goes ahead of the queue's chunks. The chunk waits for
    it to end (``waiting_for``: the transaction that records the creator's end publishes
    every chunk waiting for it). The delay is a backstop only, growing with each look (up
    to ``GROUP_WAIT_MAX_MS``). A creator that completed since the chunk looked gives its
    group at once. One that ended without a group (failed for good, cancelled) fails this
    run instead: the chunk then fails closed once its attempts are spent, and a resume
    restarts both. (Waiting for an ended creator would wake the chunk at once, again and
    again.)
    """
    created = add(
        CREATE,
        {"campaignId": campaign_id, "generation": generation},
        queue=QUEUE,
        opts=provider_options(create_job_id(campaign_id, generation)),
    )
    ended = None if created.created else _state_of(created.job_id)
    if ended == "completed":
        group_id = generations.readiness(campaign_id, generation).group_id
        if group_id is not None:
            return group_id
    if ended in ("completed", "failed", "cancelled"):
        raise GroupUnavailable(f"the group of generation {generation} could not be created")
    wait_ms = min(GROUP_WAIT_MS * max(1, job.attempts_started), GROUP_WAIT_MAX_MS)
    raise Defer(wait_ms, "waiting for the generation's group", waiting_for=[created.job_id])


def _state_of(job_id: str) -> str | None:
    found = get_job(job_id)
    return found.state if found is not None else None


def _load_messages(campaign: campaigns.Campaign, chunk_no: int, group_id: str) -> int:
    provider = _provider()
    total = 0
    for batch in campaigns.message_batches(campaign, chunk_no):
        try:
            total += provider.add_messages(group_id, batch)
        except GroupConflict:
            raise UnrecoverableError(
                f"group {group_id} was sent before chunk {chunk_no} loaded"
            ) from None
        except ProviderRejected as refused:  # retrying the same request cannot help
            raise UnrecoverableError(f"provider refused chunk {chunk_no}: {refused}") from None
    return total


def after_load(campaign_id: str, generation: int | None) -> None:
    """After a load record: send the chunk's generation if it is complete, and finalize the
    campaign if every chunk is loaded (both read in one statement)."""
    if generation is None:
        if generations.all_loaded(campaign_id):
            finalize(campaign_id)
        return
    ready, everything = generations.progress(campaign_id, generation)
    _send_if_complete(campaign_id, generation, ready)
    if everything:
        finalize(campaign_id)


def maybe_send(campaign_id: str, generation: int) -> None:
    """Queue the generation's send if the count equation holds (the job id dedups)."""
    _send_if_complete(campaign_id, generation, generations.readiness(campaign_id, generation))


def _send_if_complete(campaign_id: str, generation: int, ready: generations.Readiness) -> None:
    if ready.complete and not ready.sent:
        data = {"campaignId": campaign_id, "generation": generation, "groupId": ready.group_id}
        add(
            SEND,
            data,
            queue=QUEUE,
            opts=SEND_OPTS.model_copy(update={"job_id": f"{SEND}:{ready.group_id}"}),
        )


def finalize(campaign_id: str) -> dict:
    """Once every chunk is loaded, the last generation closes and everything sendable is sent."""
    if not generations.all_loaded(campaign_id):
        return {"finalized": False}
    numbers = generations.generations(campaign_id)
    if numbers:
        generations.close(campaign_id, numbers[-1], open_next=False)
    for generation in numbers:
        maybe_send(campaign_id, generation)
    campaigns.maybe_report(campaign_id)
    return {"finalized": True, "generations": len(numbers)}


@handler(FINALIZE, queue=QUEUE, control=True)
def finalize_campaign(job: JobContext) -> dict:
    """The chord's callback; harmless if it never fires, or fires twice."""
    return finalize(job.data["campaignId"])


@handler(CREATE, queue=QUEUE, control=True)
def create_group(job: JobContext) -> dict:
    """Create the generation's group; concurrent creators settle on the first recorded."""
    campaign_id, generation = job.data["campaignId"], job.data["generation"]
    generations.open_generation(campaign_id, generation)  # prepared ahead: not opened yet
    existing = generations.readiness(campaign_id, generation).group_id
    if existing is not None and job.attempts_started == 1:
        return {"groupId": existing, "created": False}
    # A re-run may have created a group before it died or lost the race: the
    # idempotency key (this job's id) returns that same group, never a second one.
    provider = _provider()
    generations.record_attempt(campaign_id, generation, job.id)
    mine = provider.create_group(_group_name(campaign_id, generation), idempotency_key=job.id)
    kept = existing or generations.attach_group(campaign_id, generation, mine)
    if kept != mine:
        _delete_empty(provider, mine)  # the loser's group is empty: remove it
    return {"groupId": kept, "created": kept == mine}


def _group_name(campaign_id: str, generation: int) -> str:
    return f"{campaign_id}:g{generation}"


def remove_losing_groups(
    provider: ProviderClient, campaign_id: str, generation: int, kept: str
) -> int:
    """Delete the empty groups of creators that lost, even ones that died before cleaning up.

    Each attempt's idempotency key gives back the group it made (or a fresh
    empty one, deleted just the same), so nothing depends on the creator
    having lived long enough to tidy up after itself.
    """
    removed = 0
    for key in generations.attempts(campaign_id, generation):
        group_id = provider.create_group(_group_name(campaign_id, generation), idempotency_key=key)
        if group_id != kept:
            _delete_empty(provider, group_id)
            removed += 1
    return removed


def _delete_empty(provider: ProviderClient, group_id: str) -> None:
    try:
        provider.delete_group(group_id)
    except ProviderRejected as refused:
        if refused.provider_status != 404:  # 404: already deleted by an earlier run
            raise


@handler(SEND, queue=QUEUE, control=True)
def send_group(job: JobContext) -> dict:
    """Send a complete generation exactly once: durable marker, then provider status."""
    campaign_id, generation, group_id = (
        job.data["campaignId"],
        job.data["generation"],
        job.data["groupId"],
    )
    ready = generations.readiness(campaign_id, generation)
    if ready.sent:
        removed = remove_losing_groups(_provider(), campaign_id, generation, group_id)
        return {"groupId": group_id, "sent": True, "already": True, "losingGroupsRemoved": removed}
    if not ready.complete:
        raise Stragglers(
            f"{ready.assigned - ready.loaded} chunks of generation {generation} are still loading"
        )
    provider = _provider()
    if not provider.status(group_id).sent:
        try:
            provider.send(group_id)
        except GroupConflict:
            if not provider.status(group_id).sent:
                raise
    generations.mark_sent(campaign_id, generation)
    removed = remove_losing_groups(provider, campaign_id, generation, group_id)
    campaigns.maybe_report(campaign_id)
    return {"groupId": group_id, "sent": True, "losingGroupsRemoved": removed}


@handler(MONITOR, queue=QUEUE, events=False, quiet=True)
def monitor_campaigns(job: JobContext) -> dict:
    """Report campaigns that stopped making progress; clear entries of finished ones.

    It fires every 10 s: without Celery task events (``events=False``) it stays
    out of Flower's task list, where it would drown the jobs people look for,
    and ``quiet=True`` keeps its routine runs out of the console and of
    ``keel jobs list``'s default page. Its records (``keel jobs list --name
    campaign.monitor``) are kept as usual; a failure is logged as any other.
    """
    return campaigns.watch(job.data.get("quietSeconds"))

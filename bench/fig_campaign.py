"""P4: a synthetic campaign through Keel against a plain loop posting the same batches.

The raw side is the sandbox's own ingest rate for this traffic: one client,
one request after another — create a group, add 1,000 messages per request
until it holds 10,000, send it, next group. The Keel side is a real campaign
(``tasks.notifications.service.create``) run by a real worker (``-c 2``):
plan, chunk jobs, group creation, loads, sends and the report. Both must
leave the provider's ledger with every message accepted once and every
group sent once, or the figure is an error. The sandbox is reset between runs.
"""

from __future__ import annotations

import time

import requests
from sqlalchemy import text

from bench.meters import RssSampler
from bench.plan import Run
from bench.procs import CeleryWorker, HttpChild, sandbox, wait_for
from bench.stats import Figure, Series, ratio

TEMPLATE = "Hello {seq}, your Keel bench message is ready."
BATCH = 1000
RATIO_TARGET = 0.8
PSS_TARGET_MB = 300  # PSS: pages the prefork children share are split between them


def _groups(n: int, capacity: int) -> int:
    return -(-n // capacity)


def _admin() -> dict[str, str]:
    """The sandbox's admin key (``BenchEnv`` exports it to the sandbox and to us)."""
    from tasks.notifications.provider import SANDBOX_ADMIN_HEADER
    from tasks.platform.config import get_settings

    return {SANDBOX_ADMIN_HEADER: get_settings().sandbox_admin_key}


def _verify(provider: HttpChild, n: int, groups: int, who: str) -> dict:
    """The provider's ledger must show exactly ``n`` messages accepted and sent, once each."""
    totals = requests.get(
        provider.url + "/v1/ledger", params={"summary": "true"}, headers=_admin(), timeout=300
    ).json()["totals"]
    expected = {
        "accepted": n,
        "sentMessages": n,
        "distinctMessages": n,
        "dropped": 0,
        "messagesInSeveralGroups": 0,
        "sentGroups": groups,
        "sends": groups,
    }
    wrong = {k: totals.get(k) for k, v in expected.items() if totals.get(k) != v}
    if wrong:
        raise RuntimeError(f"P4 {who}: provider ledger differs from {expected}: {wrong}")
    return {k: totals[k] for k in expected}


def _reset(provider: HttpChild) -> None:
    requests.post(
        provider.url + "/admin/reset", json={}, headers=_admin(), timeout=120
    ).raise_for_status()


def raw_loop(provider: HttpChild, n: int, capacity: int, tag: str) -> float:
    """Post the same batches straight to the sandbox; messages/s."""
    from tasks.notifications.templates import render

    client = requests.Session()
    started = time.time()
    for first in range(0, n, capacity):
        created = client.post(
            provider.url + "/v1/groups",
            json={"name": f"{tag}:{first}"},
            headers={"Idempotency-Key": f"{tag}:{first}"},
            timeout=30,
        )
        created.raise_for_status()
        group = created.json()["groupId"]
        for start in range(first, min(n, first + capacity), BATCH):
            messages = [
                {
                    "messageId": f"{tag}:{seq}",
                    "to": f"+82-10-{seq:08d}",
                    "text": render(TEMPLATE, {"seq": seq}),
                }
                for seq in range(start, min(n, first + capacity, start + BATCH))
            ]
            client.post(
                provider.url + f"/v1/groups/{group}/messages",
                json={"messages": messages},
                timeout=60,
            ).raise_for_status()
        client.post(provider.url + f"/v1/groups/{group}/send", timeout=30).raise_for_status()
    return n / (time.time() - started)


def keel_campaign(run: Run, n: int) -> tuple[float, str]:
    """Create the campaign; messages/s until its report is recorded (Postgres clock)."""
    from tasks.jobs import Owner
    from tasks.notifications.service import NewCampaign, create
    from tasks.platform.db import transaction

    spec = NewCampaign(
        name=f"{run.tag} P4",
        category="bench",
        template=TEMPLATE,
        recipients=None,
        recipient_count=n,
        chunk_size=run.sizes.chunk_size,
    )
    started = time.time()
    campaign = create(Owner(run.tag, "bench-user"), spec)

    def reported() -> object:
        with transaction() as session:
            return session.execute(
                text("SELECT reported_at FROM campaigns WHERE id = :c"), {"c": campaign.id}
            ).scalar()

    done = wait_for(reported, 120 + n / 1000, f"campaign of {n} recipients", interval=0.25)
    return n / (done.timestamp() - started), campaign.id


def _forget(campaign_id: str) -> None:
    """Remove the campaign's rows and jobs so every repetition starts from the same tables."""
    from tasks.jobs.store import counts
    from tasks.platform.db import transaction

    with transaction() as session:
        session.execute(
            text("DELETE FROM jobs WHERE data ->> 'campaignId' = :c"), {"c": campaign_id}
        )
        for table in ("campaign_chunks", "campaign_generations", "campaign_watch"):
            session.execute(text(f"DELETE FROM {table} WHERE campaign_id = :c"), {"c": campaign_id})
        session.execute(text("DELETE FROM campaigns WHERE id = :c"), {"c": campaign_id})
    while counts.compact():
        pass


def p4_campaign(run: Run) -> Figure:
    from tasks.platform.config import get_settings

    n, capacity = run.sizes.recipients, get_settings().provider_capacity
    fig = Figure(
        "P4",
        f"Campaign of {n:,} recipients → provider sandbox",
        target=f"Keel ≥ {RATIO_TARGET}x raw; peak worker PSS < {PSS_TARGET_MB} MB",
    )
    raw_s, keel_s = Series("raw loop", "msgs/s"), Series("Keel campaign", "msgs/s")
    rss_s = Series("Keel worker peak RSS", "MB", chart=False)
    pss_s = Series("Keel worker peak PSS", "MB", chart=False)
    idle_s = Series("Keel worker idle RSS", "MB", chart=False)
    ledgers: list[dict] = []
    provider = sandbox(run.env)
    with provider:
        for rep in range(run.repeat):
            run.log(f"P4 rep {rep + 1}/{run.repeat}: raw loop, {n:,} messages")
            _reset(provider)
            raw_s.samples.append(raw_loop(provider, n, capacity, f"{run.tag}-raw{rep}"))
            ledgers.append({"system": "raw", **_verify(provider, n, _groups(n, capacity), "raw")})
            run.log(f"  raw {raw_s.samples[-1]:,.0f} msgs/s; now a Keel campaign")
            _reset(provider)
            worker = CeleryWorker(run.env, "keel-bench", "tasks", run.sizes.worker_concurrency)
            with worker, RssSampler(worker.pid) as rss:  # the worker is up before the sampler
                idle_s.samples.append(rss.sample()[0] / 2**20)
                rate, campaign_id = keel_campaign(run, n)
            keel_s.samples.append(rate)
            rss_s.samples.append(rss.peak_bytes / 2**20)
            pss_s.samples.append(rss.peak_pss_bytes / 2**20)
            ledgers.append(
                {
                    "system": "keel",
                    "rss_samples": rss.samples,
                    **_verify(provider, n, _groups(n, capacity), "Keel"),
                }
            )
            _forget(campaign_id)
            run.log(f"  Keel {rate:,.0f} msgs/s, peak RSS {rss_s.samples[-1]:.0f} MB")
    fig.series = [raw_s, keel_s, rss_s, pss_s, idle_s]
    fig.ratio = ratio(keel_s, raw_s)
    fig.ratio_text = "Keel campaign / raw loop (msgs/s)"
    fig.met = fig.ratio >= RATIO_TARGET and max(pss_s.samples) < PSS_TARGET_MB
    fig.details = {
        "recipients": n,
        "chunk_size": run.sizes.chunk_size,
        "group_capacity": capacity,
        "messages_per_request": BATCH,
        "ledgers": ledgers,
    }
    fig.notes.append(
        "memory is summed over the worker's process tree (main + prefork children): RSS "
        "counts the pages they share once per process, PSS (the target) splits them"
    )
    return fig

"""``keel campaign verify``: the group send's four invariants, against the provider's ledger.

Only the provider knows what really happened (silent capacity drops, sends
whose response was lost), so every count here comes from its ledger; Keel's
own records only say which generation should own which group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.jobs.observe import events
from tasks.notifications import campaigns
from tasks.notifications.provider import ProviderClient


@dataclass
class Check:
    name: str
    ok: bool
    figures: dict[str, Any] = field(default_factory=dict)


def _campaign_groups(ledger: dict[str, Any], campaign_id: str) -> dict[int, list[dict]]:
    """The provider's groups of this campaign, by the generation named in the group's name."""
    by_generation: dict[int, list[dict]] = {}
    prefix = f"{campaign_id}:g"
    for group in ledger["groups"]:
        name = group.get("name") or ""
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            by_generation.setdefault(int(name[len(prefix) :]), []).append(group)
    return by_generation


def _found(expected: str | None, live: list[dict]) -> dict[str, Any]:
    return {"expected": expected, "live": [(x["groupId"], x["count"]) for x in live]}


def _one_group_each(by_gen: dict[int, list[dict]], expected: dict[int, str | None]) -> Check:
    live = {g: [x for x in groups if not x["deleted"]] for g, groups in by_gen.items()}
    wrong = {
        g: _found(expected[g], live.get(g, []))
        for g in expected
        if len(live.get(g, [])) != 1 or live[g][0]["groupId"] != expected[g]
    }
    strays = [g for g in live if g not in expected and live[g]]
    deleted = [x for groups in by_gen.values() for x in groups if x["deleted"]]
    figures = {
        "generations": len(expected),
        "wrong": wrong,
        "strayGenerations": strays,
        "deletedLosers": len(deleted),
        "nonEmptyDeleted": [x["groupId"] for x in deleted if x["count"]],
    }
    ok = not wrong and not strays and not figures["nonEmptyDeleted"]
    return Check("1. each generation has exactly one provider group", ok, figures)


def _sent_once_when_complete(groups: list[dict], expected_sizes: dict[str, int]) -> Check:
    bad_count = [g["groupId"] for g in groups if g["sendCount"] != 1]
    partial = [
        g["groupId"]
        for g in groups
        if g["sendCount"] == 1 and g["sentMessages"] != expected_sizes.get(g["groupId"])
    ]
    return Check(
        "2. each group triggered once, only when every assigned chunk was loaded",
        not bad_count and not partial,
        {
            "groups": len(groups),
            "sends": sum(g["sendCount"] for g in groups),
            "rejectedRepeatSends": sum(g["rejectedSends"] for g in groups),
            "notSentExactlyOnce": bad_count,
            "sentIncomplete": partial,
        },
    )


def _messages_once(provider: ProviderClient, groups: list[dict], planned: int) -> Check:
    most, distinct, dropped = 0, 0, 0
    for group in groups:
        scoped = provider.ledger(groupId=group["groupId"], summary="1")["totals"]
        most = max(most, scoped["maxAcceptancesPerMessage"])
        distinct += scoped["distinctMessages"]
        dropped += scoped["dropped"]
    return Check(
        "3. every message landed in a group exactly once",
        most <= 1 and distinct == planned and dropped == 0,
        {
            "planned": planned,
            "landed": distinct,
            "maxPerMessage": most,
            "droppedOverCapacity": dropped,
        },
    )


def _reported_once(campaign_id: str) -> Check:
    campaign = campaigns.get(campaign_id)
    emitted = [
        e
        for e in events.read([campaigns.EVENTS_QUEUE])
        if e["event"] == "campaign.report" and e["jobId"] == campaign_id
    ]
    return Check(
        "4. the campaign report was emitted exactly once",
        campaign.reported_at is not None and len(emitted) <= 1,
        {"reported": campaign.reported_at is not None, "reportEvents": len(emitted)},
    )


def verify(campaign_id: str, provider: ProviderClient | None = None) -> list[Check]:
    provider = provider or ProviderClient.from_settings()
    campaign = campaigns.get(campaign_id)
    status = campaigns.describe(campaign)
    expected = {g["generation"]: g["groupId"] for g in status["generations"]}
    sizes = {g["groupId"]: g["messages"] for g in status["generations"] if g["groupId"]}
    by_gen = _campaign_groups(provider.ledger(summary="1"), campaign_id)
    mine = [x for g in by_gen.values() for x in g if not x["deleted"]]
    return [
        _one_group_each(by_gen, expected),
        _sent_once_when_complete(mine, sizes),
        _messages_once(provider, mine, campaign.recipient_count),
        _reported_once(campaign_id),
    ]

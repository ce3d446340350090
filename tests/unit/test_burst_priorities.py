"""``tenancy.priorities``: a batch of jobs is placed behind what its party already has and
behind the batch's own jobs at or before its rank, whichever way it is counted."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tasks.jobs.intake import tenancy
from tasks.jobs.intake.tenancy import TenantLoad

Job = tuple[str, str | None, str, int]


def _reference(jobs: list[Job], on_queue: dict[tuple[str | None, str, int], int]) -> dict:
    """The placement spelled out: each job counts the jobs of its party on its queue at
    or before its rank, already there (less the batch's own) or placed before it."""
    found = {}
    for i, (job_id, tenant, queue, rank_) in enumerate(jobs):
        party = [j for j in jobs if (j[1], j[2]) == (tenant, queue)]
        mine = sum(1 for j in party if j[3] <= rank_)
        earlier = sum(1 for j in jobs[:i] if (j[1], j[2]) == (tenant, queue) and j[3] <= rank_)
        before = on_queue[(tenant, queue, rank_)] - mine + earlier
        found[job_id] = tenancy.priority_for(max(0, before))
    return found


@pytest.mark.parametrize("seed", range(12))
def test_a_batch_is_placed_as_spelled_out_one_rank_or_many(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    parties = [(None, "default"), ("t1", "default"), ("t1", "reports"), ("t2", "default")]
    jobs: list[Job] = []
    for i in range(rng.randint(1, 60)):
        tenant, queue = rng.choice(parties)
        # the first two parties have one rank each (the fast way), the others several
        rank_ = 0 if (tenant, queue) in parties[:2] else rng.choice([0, 1, 3])
        jobs.append((f"j{i}", tenant, queue, rank_))
    in_batch = Counter((t, q, r) for _, t, q, r in jobs)
    on_queue = {}
    for tenant, queue, rank_ in {(t, q, r) for _, t, q, r in jobs}:
        at_or_before = sum(
            n for (t, q, r), n in in_batch.items() if (t, q) == (tenant, queue) and r <= rank_
        )
        # The count includes the batch and what the party had; on some seeds it is below
        # the batch's own (the placement is then clamped at none ahead, either way).
        extra = rng.randint(-8 if seed % 3 == 0 else 0, 20)
        on_queue[(tenant, queue, rank_)] = at_or_before + extra

    def load(session: object, tenant: str | None, queue: str, rank_: int = 0) -> TenantLoad:
        return TenantLoad(0, on_queue[(tenant, queue, rank_)])

    monkeypatch.setattr(tenancy, "load", load)
    assert tenancy.priorities(None, jobs) == _reference(jobs, on_queue)  # type: ignore[arg-type]


def test_a_burst_of_one_party_spreads_over_the_priorities(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs: list[Job] = [(f"j{i}", None, "default", 0) for i in range(20)]
    monkeypatch.setattr(tenancy, "load", lambda *a, **k: TenantLoad(0, 20))  # nothing else
    placed = tenancy.priorities(None, jobs)  # type: ignore[arg-type]
    expected = [tenancy.priority_for(i) for i in range(20)]
    assert [placed[j[0]] for j in jobs] == expected
    assert len(set(expected)) == len(tenancy.PRIORITY_STEPS)  # every step is reached

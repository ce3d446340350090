"""Standing schedulers: the ones an app keeps in place whenever beat runs.

An app declares the function that upserts its scheduler (idempotent: an unchanged
rule keeps its next fire) with ``@standing(scheduler_id)``. Beat
(``tasks.jobs.schedule.beat.KeelScheduler``) calls every declared function when it
starts, and calls again, at each tick, those that failed (a database that is away
at start, a deadlock with a migration, another beat inserting the same scheduler
at the same moment), until each has worked once.
"""

from __future__ import annotations

from collections.abc import Callable

Ensure = Callable[[], None]

_declared: dict[str, Ensure] = {}


def standing(scheduler_id: str) -> Callable[[Ensure], Ensure]:
    """Declare ``ensure`` as what keeps the system scheduler ``scheduler_id`` in place."""

    def declare(ensure: Ensure) -> Ensure:
        _declared[scheduler_id] = ensure
        return ensure

    return declare


def declared() -> dict[str, Ensure]:
    """Every standing scheduler's id and its ``ensure``, in the order declared."""
    return dict(_declared)

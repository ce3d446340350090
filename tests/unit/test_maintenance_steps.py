"""The maintenance loop runs its steps apart: one that keeps failing holds back no other."""

from __future__ import annotations

import logging

from tasks.jobs.upkeep import maintenance


def test_a_failing_step_is_logged_and_the_next_steps_still_run(caplog):
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("a record no release can read")

    with caplog.at_level(logging.WARNING, logger=maintenance.__name__):
        maintenance._each(
            ("promoting due jobs", broken),
            ("requeueing stalled jobs", lambda: ran.append("stalls")),
            ("compacting state counts", lambda: ran.append("counts")),
        )
    assert ran == ["broken", "stalls", "counts"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["job maintenance: promoting due jobs failed; retrying"]

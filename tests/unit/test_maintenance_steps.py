"""The maintenance loop runs its steps apart: one that keeps failing holds back no other,
but the database away ends the round at its first step (every step needs it)."""

from __future__ import annotations

import logging

import psycopg
from sqlalchemy.exc import OperationalError

from tasks.jobs.upkeep import maintenance


def test_a_failing_step_is_logged_and_the_next_steps_still_run(caplog):
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("a record no release can read")

    with caplog.at_level(logging.WARNING, logger=maintenance.__name__):
        worked = maintenance._each(
            ("promoting due jobs", broken),
            ("requeueing stalled jobs", lambda: ran.append("stalls")),
            ("compacting state counts", lambda: ran.append("counts")),
        )
    assert not worked
    assert ran == ["broken", "stalls", "counts"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["job maintenance: promoting due jobs failed; retrying"]


def test_the_database_away_ends_the_round_at_the_first_step():
    ran: list[str] = []

    def away() -> None:
        ran.append("away")
        refused = psycopg.OperationalError("connection refused")  # no SQLSTATE: no answer
        raise OperationalError("SELECT 1", {}, refused)

    worked = maintenance._each(
        ("promoting due jobs", away),
        ("requeueing stalled jobs", lambda: ran.append("stalls")),
    )
    assert not worked and ran == ["away"]
    assert maintenance._each(("compacting state counts", lambda: ran.append("counts")))

"""P11's arithmetic and plumbing: stamps in, pickup and lateness percentiles out (no timing)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import pickup
from bench.fig_pickup import QUANTITIES, Side, _series, paced
from bench.pickup import Stamp


def test_pickup_counts_from_the_add_and_lateness_from_when_the_job_was_due():
    stamp = Stamp(added=100.0, due=101.5, started=101.52)
    assert stamp.pickup_ms == pytest.approx(1520)
    assert stamp.lateness_ms == pytest.approx(20)
    # a job with no delay is due when added: its lateness is its pickup
    assert Stamp(100.0, 100.0, 100.004).lateness_ms == pytest.approx(4)


def test_summary_gives_interpolated_percentiles_and_the_achieved_add_rate():
    # 101 jobs added 10 ms apart, picked up after 0, 1, ..., 100 ms
    stamps = [Stamp(i / 100, i / 100, i / 100 + i / 1000) for i in range(101)]
    found = pickup.summary(stamps)
    assert found["jobs"] == 101
    assert found["pickup_p50_ms"] == pytest.approx(50)
    assert found["pickup_p99_ms"] == pytest.approx(99)
    assert found["pickup_max_ms"] == pytest.approx(100)
    assert found["lateness_p99_ms"] == pytest.approx(99)
    assert found["add_rate"] == pytest.approx(100)
    assert math.isnan(pickup.summary([])["pickup_p99_ms"])
    assert math.isnan(pickup.add_rate(stamps[:1]))


def test_the_slowest_starts_say_when_they_were_added_in_add_order():
    stamps = [Stamp(10 + i, 10 + i, 10 + i + (0.5 if i in (3, 7) else 0.01)) for i in range(10)]
    assert pickup.slowest(stamps, k=2) == [
        (3, pytest.approx(500)),
        (7, pytest.approx(500)),
    ]
    assert pickup.slowest([]) == []


def test_a_line_still_being_written_is_not_read():
    lines = ["1.0\t1.0\t1.5\n", "\n", "2.0\t3.0\t3.25\n", "4.0\t4.0"]
    assert pickup.parse(lines) == [Stamp(1.0, 1.0, 1.5), Stamp(2.0, 3.0, 3.25)]


def test_records_of_a_batch_are_read_back_exactly_from_its_own_folder(tmp_path: Path):
    first, second = tmp_path / "a", tmp_path / "b"
    pickup.record(str(first), 1.25, 2.5, 2.625)
    pickup.record(str(first), 1.5, 1.5, 1.75)
    pickup.record(str(second), 7.0, 7.0, 7.125)  # the next batch: the first file is closed
    assert pickup.read(first) == [Stamp(1.25, 2.5, 2.625), Stamp(1.5, 1.5, 1.75)]
    assert pickup.read(second) == [Stamp(7.0, 7.0, 7.125)]


def test_delays_stay_within_one_to_two_seconds_and_are_the_same_for_every_system():
    delays = [pickup.delay_ms(i) for i in range(1000)]
    assert min(delays) >= 1000 and max(delays) < 2000
    assert len(set(delays)) == 1000  # spread over the window, not bunched
    assert delays == [pickup.delay_ms(i) for i in range(1000)]


def _fake_side(started_after_s: float, lose: int = 0) -> tuple[Side, list]:
    """A system whose jobs start ``started_after_s`` after their add (or due time)."""
    removed: list = []
    added: list = []

    def add(out: str, at: float, delay: int) -> int:
        due = at + delay / 1000
        if len(added) >= lose:
            pickup.record(out, at, due, due + started_after_s)
        added.append(due)
        return len(added)

    side = Side(
        worker=lambda: None,  # never started: paced() does not start workers
        burst=lambda k: ({}, lambda: None),
        add=add,
        finished=lambda ids: len(ids),
        cleanup=removed.extend,
    )
    return side, removed


def test_a_paced_phase_adds_rate_times_seconds_jobs_and_summarises_their_stamps(tmp_path):
    side, removed = _fake_side(0.002)
    found = paced(side, tmp_path / "half", rate=2000, seconds=0.01, delayed=False)
    assert found["jobs"] == 20 and found["rate"] == 2000
    assert found["pickup_p99_ms"] == pytest.approx(2, abs=1e-3)
    assert removed == list(range(1, 21))  # every job removed afterwards

    side, _ = _fake_side(0.003)
    delayed = paced(side, tmp_path / "delayed", rate=2000, seconds=0.01, delayed=True)
    assert delayed["lateness_p99_ms"] == pytest.approx(3, abs=1e-3)
    assert delayed["pickup_p50_ms"] > 1000  # its pickup includes its 1-2 s delay


def test_a_phase_missing_start_stamps_is_an_error_not_a_figure(tmp_path):
    side, _ = _fake_side(0.001, lose=1)
    with pytest.raises(RuntimeError, match="19 start stamps for 20 jobs"):
        paced(side, tmp_path / "half", rate=2000, seconds=0.01, delayed=False)


def test_series_are_one_per_quantity_and_system_with_a_sample_per_repetition():
    def phase(ms: float) -> dict:
        return {
            "pickup_p50_ms": ms,
            "pickup_p99_ms": 2 * ms,
            "lateness_p50_ms": ms,
            "lateness_p99_ms": 3 * ms,
        }

    runs = [
        {"system": name, "rep": rep, "capacity": 100.0 * (rep + 1)}
        | {level: phase(base + rep) for level in ("half load", "90%", "delayed")}
        for rep in range(2)
        for name, base in (("bare Celery", 1.0), ("Keel", 5.0))
    ]
    series = _series(runs, ["bare Celery", "Keel"])
    assert len(series) == 2 * len(QUANTITIES)
    assert series[("Keel", "p99 pickup, half load")].samples == [10.0, 12.0]
    assert series[("bare Celery", "p99 lateness, delayed 1-2 s")].samples == [3.0, 6.0]
    assert series[("Keel", "capacity (P1's batch)")].samples == [100.0, 200.0]
    assert [s.chart for s in series.values()].count(True) == 2  # p99 at half load only

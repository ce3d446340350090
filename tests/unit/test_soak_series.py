"""The soak's leak checks on made-up series: a leak fails, noise and a sawtooth pass."""

from __future__ import annotations

import csv
import json
import math
import random

from tests.support.soak_series import Limit, Series, judge, percentile, slope_per_hour, write_series


def hour_of(values, step_s: float = 60.0, name: str = "rss") -> Series:
    series = Series()
    for i, value in enumerate(values):
        series.add(i * step_s, {name: value})
    return series


def test_slope_is_per_hour_and_exact_on_a_line():
    times = [0, 60, 120, 180]
    assert math.isclose(slope_per_hour(times, [100, 101, 102, 103]), 60.0)
    assert slope_per_hour(times, [5, 5, 5, 5]) == 0.0
    assert slope_per_hour([0], [1]) == 0.0
    assert math.isclose(slope_per_hour(times, [1, math.nan, 3, 4]), 60.0)


def test_percentile_is_nearest_rank():
    assert percentile(range(1, 101), 99) == 99
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 99))


def test_a_steady_leak_fails_and_noise_around_a_level_passes():
    rng = random.Random(1)
    limit = Limit("rss", "MB", slope_per_hour=20, headroom=15)
    leak = hour_of([200 + i * 0.5 + rng.gauss(0, 2) for i in range(60)])  # 30 MB/h
    flat = hour_of([200 + rng.gauss(0, 2) for _ in range(60)])
    leaking = judge(leak, limit)
    assert not leaking.ok and 20 < leaking.slope < 40, leaking.line()
    assert judge(flat, limit).ok, judge(flat, limit).line()


def test_warm_up_growth_in_the_first_half_is_not_a_leak():
    limit = Limit("rss", "MB", slope_per_hour=20, headroom=15)
    warm_then_flat = hour_of([100 + min(i, 20) * 5 for i in range(60)])
    assert judge(warm_then_flat, limit).ok


def test_a_sawtooth_that_vacuum_cuts_passes_a_climbing_one_fails_headroom():
    limit = Limit("dead", "rows", headroom=500, short=True)
    vacuumed = hour_of([(i % 10) * 100 for i in range(60)], name="dead")
    climbing = hour_of([(i % 10) * 100 + i * 30 for i in range(60)], name="dead")
    assert judge(vacuumed, limit, slopes=False).ok
    verdict = judge(climbing, limit, slopes=False)
    assert not verdict.ok and "2nd half max" in verdict.failures[0]


def test_short_runs_skip_slopes_but_keep_ceilings():
    limit = Limit("fds", "fds", slope_per_hour=5, ceiling=100, short=True)
    rising = hour_of([50 + i for i in range(18)], step_s=10, name="fds")  # 360/h, under 100
    assert judge(rising, limit, slopes=False).ok
    assert not judge(rising, limit).ok
    assert not judge(hour_of([50, 60, 120], name="fds"), limit, slopes=False).ok
    long_only = Limit("fds", "fds", slope_per_hour=5, ceiling=10)
    skipped = judge(hour_of([50, 60, 120], name="fds"), long_only, slopes=False)
    assert skipped.ok and not skipped.judged and "not judged" in skipped.line()


def test_marked_samples_are_left_out_and_missing_series_fail():
    series = Series()
    for i in range(20):
        series.add(i * 60.0, {"p99": 5000.0 if i == 18 else 20.0}, ["restart"] if i == 18 else [])
    assert judge(series, Limit("p99", "ms", 100, skip_marked=frozenset({"restart"}))).ok
    assert not judge(series, Limit("p99", "ms", 100)).ok
    assert judge(series, Limit("absent", "x", 1)).failures == ["no samples"]


def test_series_are_written_as_csv_json_svg_and_md(tmp_path):
    series = Series()
    series.add(0.0, {"a": 1.0})
    series.add(10.0, {"a": 2.0, "b": 5.0}, ["kill"])
    verdicts = [judge(series, Limit("a", "MB", ceiling=1.5)), judge(series, Limit("b", "MB", 10))]
    paths = write_series(series, verdicts, {"seconds": 10}, tmp_path, "soak-test")
    assert [p.suffix for p in paths] == [".csv", ".json", ".svg", ".md"]
    rows = list(csv.reader(paths[0].open()))
    assert rows == [
        ["elapsed_s", "marks", "a", "b"],
        ["0.0", "", "1", ""],
        ["10.0", "kill", "2", "5"],
    ]
    saved = json.loads(paths[1].read_text())
    assert saved["series"]["b"] == [None, 5.0] and saved["verdicts"][0]["ok"] is False
    assert paths[2].read_text().startswith("<svg") and "| a (MB) |" in paths[3].read_text()

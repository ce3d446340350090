"""The soak's time series: samples, the leak checks on them, and the files they are kept in.

Pure logic (no servers): ``tests/chaos/test_soak.py`` takes the samples, this
module fits and judges them, and ``tests/unit/test_soak_series.py`` checks the
fitting and judging on made-up series.

A series leaks when it keeps growing after warm-up. Each one is judged by a
``Limit``: the least-squares slope over the second half of the samples (per
hour) must stay under ``slope_per_hour``; its largest value must stay under
``ceiling``; and its second half may not rise above the first half's largest
value by more than ``headroom`` (a level that keeps climbing breaks through
its own earlier peak; noise does not). A short run (``slopes=False``) judges only
the limits marked ``short``, on ceiling and headroom: a slope fitted over a
minute and a half says more about noise than about leaks.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def slope_per_hour(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against ``times_s`` (seconds), in units per hour."""
    points = [(t, v) for t, v in zip(times_s, values, strict=True) if not math.isnan(v)]
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600.0


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100, nearest rank); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Limit:
    """What one series may do; ``None`` leaves that check out."""

    series: str
    unit: str
    slope_per_hour: float | None = None  # over the second half, after warm-up
    ceiling: float | None = None  # no sample above it
    headroom: float | None = None  # second half's max ≤ first half's max + headroom
    # Samples flagged with one of these marks (e.g. a Redis restart in the interval)
    # are left out of this series' checks: a designed outage is not a trend.
    skip_marked: frozenset[str] = frozenset()
    # Judged in a short run too (ceiling and headroom; never the slope)?
    short: bool = False


@dataclass
class Verdict:
    limit: Limit
    slope: float
    first_max: float
    second_max: float
    overall_max: float
    failures: list[str] = field(default_factory=list)
    judged: bool = True  # False: figures only (a short run does not judge this series)

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        unit = self.limit.unit
        bound = self.limit.slope_per_hour
        return (
            f"{self.limit.series:<28} slope {self.slope:+10.2f} {unit}/h"
            f"{f' (≤ {bound:g})' if bound is not None else '':<14} "
            f"max {self.overall_max:10.2f} {unit} "
            f"(1st half {self.first_max:.2f}, 2nd {self.second_max:.2f})"
            f"{'' if self.judged else '  (not judged)'}"
            f"{'' if self.ok else '  FAIL: ' + '; '.join(self.failures)}"
        )


@dataclass
class Series:
    """Samples at elapsed times; every sample has the same keys (NaN where unknown)."""

    times_s: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    marks: list[frozenset[str]] = field(default_factory=list)

    def add(self, elapsed_s: float, sample: Mapping[str, float], marks: Iterable[str] = ()) -> None:
        index = len(self.times_s)
        self.times_s.append(elapsed_s)
        self.marks.append(frozenset(marks))
        for name in sample.keys() | self.values.keys():
            column = self.values.setdefault(name, [math.nan] * index)
            column.append(float(sample.get(name, math.nan)))

    def __len__(self) -> int:
        return len(self.times_s)


def _finite_max(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


def judge(series: Series, limit: Limit, *, slopes: bool = True) -> Verdict:
    """Check one series against its limit (slopes over the second half when ``slopes``)."""
    keep = [i for i, marks in enumerate(series.marks) if not (marks & limit.skip_marked)]
    times = [series.times_s[i] for i in keep]
    column = series.values.get(limit.series, [])
    values = [column[i] if i < len(column) else math.nan for i in keep]
    half = len(values) // 2
    first, second = values[:half], values[half:]
    slope = slope_per_hour(times[half:], second)
    verdict = Verdict(
        limit=limit,
        slope=slope,
        first_max=_finite_max(first),
        second_max=_finite_max(second),
        overall_max=_finite_max(values),
    )
    if all(math.isnan(v) for v in values):
        verdict.failures.append("no samples")
        return verdict
    if not slopes and not limit.short:
        verdict.judged = False
        return verdict
    if slopes and limit.slope_per_hour is not None and slope > limit.slope_per_hour:
        verdict.failures.append(f"grows {slope:.2f} {limit.unit}/h > {limit.slope_per_hour:g}")
    if limit.ceiling is not None and verdict.overall_max > limit.ceiling:
        verdict.failures.append(f"reached {verdict.overall_max:.2f} > ceiling {limit.ceiling:g}")
    if (
        limit.headroom is not None
        and not math.isnan(verdict.first_max)
        and verdict.second_max > verdict.first_max + limit.headroom
    ):
        verdict.failures.append(
            f"2nd half max {verdict.second_max:.2f} > 1st half max "
            f"{verdict.first_max:.2f} + {limit.headroom:g}"
        )
    return verdict


def judge_all(series: Series, limits: Sequence[Limit], *, slopes: bool = True) -> list[Verdict]:
    return [judge(series, limit, slopes=slopes) for limit in limits]


# --- keeping the series -----------------------------------------------------------------

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    return "".join(
        " " if math.isnan(v) else SPARKS[min(7, int((v - low) / span * 7.999))] for v in values
    )


def svg_plot(series: Series, names: Sequence[str], title: str) -> str:
    """Small multiples, one panel a series, each scaled to its own range (plain SVG)."""
    width, panel_h, left, pad = 640, 70, 210, 8
    height = pad + len(names) * (panel_h + pad) + 20
    end = max(series.times_s) if series.times_s else 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{pad}" y="14" font-weight="bold">{_escape(title)}</text>',
    ]
    for row, name in enumerate(names):
        top = 20 + row * (panel_h + pad)
        values = series.values.get(name, [])
        finite = [v for v in values if not math.isnan(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        span = (high - low) or 1.0
        plot_w = width - left - pad
        points = " ".join(
            f"{left + t / (end or 1.0) * plot_w:.1f},"
            f"{top + panel_h - (v - low) / span * panel_h:.1f}"
            for t, v in zip(series.times_s, values, strict=False)
            if not math.isnan(v)
        )
        parts += [
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{panel_h}" '
            'fill="none" stroke="#ccc"/>',
            f'<text x="{pad}" y="{top + 14}">{_escape(name)}</text>',
            f'<text x="{pad}" y="{top + 30}" fill="#666">{high:.4g} max</text>',
            f'<text x="{pad}" y="{top + 46}" fill="#666">{low:.4g} min</text>',
            f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>',
        ]
    parts.append(
        f'<text x="{left}" y="{height - 4}" fill="#666">0 → {end:.0f} s of soak</text></svg>'
    )
    return "\n".join(parts)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_series(
    series: Series,
    verdicts: Sequence[Verdict],
    meta: Mapping[str, Any],
    directory: Path,
    stem: str,
) -> list[Path]:
    """``<stem>.csv`` (a row a sample), ``<stem>.json`` (meta, samples, verdicts),
    ``<stem>.svg`` (a panel a judged series) and ``<stem>.md`` (sparklines and slopes)."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(series.values)
    csv_path = directory / f"{stem}.csv"
    with csv_path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["elapsed_s", "marks", *names])
        for i, t in enumerate(series.times_s):
            row = [series.values[n][i] for n in names]
            writer.writerow(
                [f"{t:.1f}", "+".join(sorted(series.marks[i])), *(_cell(v) for v in row)]
            )
    json_path = directory / f"{stem}.json"
    json_path.write_text(
        json.dumps(
            {
                "meta": dict(meta),
                "elapsed_s": series.times_s,
                "marks": [sorted(m) for m in series.marks],
                "series": {
                    n: [None if math.isnan(v) else v for v in series.values[n]] for n in names
                },
                "verdicts": [
                    {
                        "series": v.limit.series,
                        "unit": v.limit.unit,
                        "slope_per_hour": v.slope,
                        "slope_limit": v.limit.slope_per_hour,
                        "ceiling": v.limit.ceiling,
                        "headroom": v.limit.headroom,
                        "first_half_max": _none_nan(v.first_max),
                        "second_half_max": _none_nan(v.second_max),
                        "judged": v.judged,
                        "ok": v.ok,
                        "failures": v.failures,
                    }
                    for v in verdicts
                ],
            },
            indent=1,
        )
    )
    judged = [v.limit.series for v in verdicts]
    svg_path = directory / f"{stem}.svg"
    svg_path.write_text(svg_plot(series, judged, f"Keel soak {stem}"))
    md_path = directory / f"{stem}.md"
    lines = [
        f"# Soak {stem}",
        "",
        " ".join(f"{k}={v}" for k, v in meta.items()),
        "",
        "| series | samples | slope /h (2nd half) | limit /h | max | ok |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        values = series.values.get(v.limit.series, [])
        lines.append(
            f"| {v.limit.series} ({v.limit.unit}) | `{sparkline(values)}` | {v.slope:+.2f} | "
            f"{'' if v.limit.slope_per_hour is None else f'{v.limit.slope_per_hour:g}'} | "
            f"{v.overall_max:.2f} | {'yes' if v.ok else 'NO: ' + '; '.join(v.failures)} |"
        )
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, json_path, svg_path, md_path]


def _cell(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.6g}"


def _none_nan(value: float) -> float | None:
    return None if math.isnan(value) else value

"""Figures and their summaries, kept as raw samples so a reader can recompute any claim."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in 0..100."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Series:
    """One measured quantity, one sample per repetition."""

    label: str
    unit: str
    samples: list[float] = field(default_factory=list)
    chart: bool = True  # plotted in the PNG (one unit per figure's chart)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "median": self.median,
            "min": min(self.samples, default=math.nan),
            "max": max(self.samples, default=math.nan),
        }


@dataclass
class Figure:
    """A benchmark figure: its series, the headline ratio and whether the target was met."""

    key: str
    title: str
    series: list[Series] = field(default_factory=list)
    ratio: float | None = None
    ratio_text: str = ""
    target: str = ""
    met: bool | None = None
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None  # why it could not run here (not an error)

    def get(self, label: str) -> Series:
        return next(s for s in self.series if s.label == label)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "series": [s.to_json() for s in self.series],
            "ratio": self.ratio,
            "ratio_text": self.ratio_text,
            "target": self.target,
            "met": self.met,
            "notes": self.notes,
            "details": self.details,
            "error": self.error,
            "skipped": self.skipped,
        }


def ratio(numerator: Series, denominator: Series) -> float:
    """Ratio of medians: robust to one noisy repetition on a shared host."""
    if not denominator.median or math.isnan(denominator.median):
        return math.nan
    return numerator.median / denominator.median

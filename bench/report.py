"""Writing a run down: JSON with every sample, a Markdown table, and a PNG chart."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import Figure, Series

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    """A progress line of a bench command, on stderr (its report goes to stdout)."""
    print(f"{datetime.now(UTC):%H:%M:%S} {message}", file=sys.stderr, flush=True)


def measured_commit() -> str:
    """The code measured: its commit, marked ``+changes`` if the tree differs from it."""

    def git(*args: str) -> str:
        root = RESULTS_DIR.parents[1]
        found = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return found.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def write_report(
    kind: str, report: dict[str, Any], table: str, directory: Path = RESULTS_DIR
) -> Path:
    """``report`` as ``<directory>/<kind>-<UTC timestamp>.json`` (``bench/results`` by
    default), its Markdown ``table`` beside it (``.md``); the JSON's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{kind}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    path.with_suffix(".md").write_text(table + "\n")
    return path


def _num(value: float) -> str:
    if value is None or math.isnan(value):
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _cell(series: Series) -> str:
    spread = ""
    if len(series.samples) > 1:
        spread = f" ({_num(min(series.samples))}-{_num(max(series.samples))})"
    return f"{_num(series.median)} {series.unit}{spread}"


def _load(meta: dict[str, Any], when: str) -> str:
    values = meta["machine"].get(f"loadavg_{when}")
    return "/".join(f"{v:.1f}" for v in values) if values else "?"


def markdown(meta: dict[str, Any], figures: list[Figure]) -> str:
    """The table docs/benchmarks.md shows: medians (min-max over repetitions), ratios, targets."""
    lines = [
        f"Run {meta['timestamp']} — `{meta['command']}` — {meta['repeat']} repetition(s), "
        f"{meta['machine']['cpus']} CPUs, Python {meta['machine']['python']}, "
        f"{meta['servers']['postgres']}, {meta['servers']['redis']}; load average "
        f"{_load(meta, 'start')} at start, {_load(meta, 'end')} at end (other work on the host)",
        "",
        "| Figure | Measured | Median (min-max) | Ratio | Target | Met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fig in figures:
        if fig.skipped:
            lines.append(
                f"| {fig.key} {fig.title} | skipped: {fig.skipped} | | | {fig.target} | — |"
            )
            continue
        if fig.error and not fig.series:
            lines.append(f"| {fig.key} {fig.title} | error: {fig.error} | | | {fig.target} | ✗ |")
            continue
        ratio = f"**{fig.ratio:.2f}x** {fig.ratio_text}" if fig.ratio is not None else ""
        met = "✓ yes" if fig.met else "✗ no"
        if fig.error:
            met = f"✗ invalid: {fig.error}"
        for index, series in enumerate(fig.series):
            head = f"{fig.key} {fig.title}" if index == 0 else ""
            tail = (ratio, fig.target, met) if index == 0 else ("", "", "")
            lines.append(
                f"| {head} | {series.label} | {_cell(series)} | " + " | ".join(tail) + " |"
            )
    notes = [f"- {fig.key}: {note}" for fig in figures for note in fig.notes]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _finite(value: Any) -> Any:
    """NaN is not JSON: a figure that could not be computed is ``null``."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def chart(figures: list[Figure], path: Path) -> None:
    """One panel per figure: medians as bars, min-max over repetitions as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [f for f in figures if any(s.chart and s.samples for s in f.series)]
    cols = min(3, max(1, len(shown)))
    rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.4 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, figure in zip(flat, shown, strict=False):
        series = [s for s in figure.series if s.chart and s.samples]
        medians = [s.median for s in series]
        low = [s.median - min(s.samples) for s in series]
        high = [max(s.samples) - s.median for s in series]
        colors = ["#9e9e9e", "#1f77b4", "#ff7f0e", "#2ca02c"][: len(series)]
        ax.bar(range(len(series)), medians, yerr=[low, high], color=colors, capsize=4)
        ax.set_xticks(range(len(series)), [s.label for s in series], rotation=12, fontsize=8)
        ax.set_ylabel(series[0].unit)
        if series[0].unit == "ms" and max(medians) / max(min(medians), 1e-9) > 20:
            ax.set_yscale("log")
        verdict = "" if figure.met is None else (" ✓" if figure.met else " ✗")
        ratio = f"\n{figure.ratio:.2f}x {figure.ratio_text.split(' (')[0]}" if figure.ratio else ""
        ax.set_title(f"{figure.key}{verdict} {figure.title}{ratio}", fontsize=9)
        for x, value in enumerate(medians):  # beside the bar, clear of the error bar
            ax.annotate(_num(value), (x + 0.08, value), ha="left", va="bottom", fontsize=8)
    for ax in flat[len(shown) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(meta: dict[str, Any], figures: list[Figure], out_dir: Path) -> dict[str, Path]:
    """``<ts>.json``, ``<ts>.md``, ``latest.md`` and ``<ts>.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = meta["timestamp"].replace(":", "").replace("-", "")
    paths = {ext: out_dir / f"{stamp}.{ext}" for ext in ("json", "md", "png")}
    body = {"meta": meta, "figures": {f.key: f.to_json() for f in figures}}
    paths["json"].write_text(json.dumps(_finite(body), indent=2, default=str) + "\n")
    table = markdown(meta, figures)
    paths["md"].write_text(table)
    shutil.copyfile(paths["md"], out_dir / "latest.md")
    try:
        chart(figures, paths["png"])
    except ImportError:  # the chart is the one part that needs the bench extra
        print("no PNG: matplotlib is missing (pip install -e '.[bench]')", flush=True)
        del paths["png"]
    return paths

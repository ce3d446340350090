"""What a figure measures besides time: peak memory and CPU seconds of process trees."""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass, field

import psutil


@dataclass
class RssSampler:
    """Peak memory of a process tree (main process plus every child), sampled.

    RSS summed over the tree counts copy-on-write pages shared by prefork
    children once per process; PSS splits them, so both are kept.
    """

    pid: int
    interval_s: float = 0.2
    peak_bytes: int = 0  # RSS
    peak_pss_bytes: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> tuple[int, int]:
        """``(rss, pss)`` in bytes, summed over the tree now."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0, 0
        rss = pss = 0
        for proc in procs:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        return rss, pss

    def _record(self) -> None:
        rss, pss = self.sample()
        self.peak_bytes = max(self.peak_bytes, rss)
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._record()


@dataclass
class CpuMeter:
    """CPU seconds spent by process trees (and this process) between two readings.

    On a shared host throughput swings with the neighbours' load; CPU time
    per job moves much less, so it is the steadier way to compare two
    systems' costs. Processes that exit between readings are counted through
    their parent's ``children_*`` times (Postgres backends, for instance).
    """

    roots: dict[str, int]

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for group, pid in self.roots.items():
            total = 0.0
            try:
                root = psutil.Process(pid)
                times = root.cpu_times()
                total += times.children_user + times.children_system
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                procs = []
            for proc in procs:
                try:
                    times = proc.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += times.user + times.system
            out[group] = total
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["bench process"] = usage.ru_utime + usage.ru_stime
        return out

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {group: after[group] - before.get(group, 0.0) for group in after}

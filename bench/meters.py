"""What a figure measures besides time: peak memory and CPU seconds of process trees."""

from __future__ import annotations

import re
import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


STATEMENT_LINE = re.compile(rb"\[(\d+)\] LOG:  (?:statement|execute [^:]*):")


@dataclass
class RoundTrips:
    """Round trips the servers answered while a block ran: Postgres statements and Redis reads.

    Postgres: every statement a client sends is one round trip (psycopg sends a
    statement's parse, bind and execute together); ``set_logging("all")`` turns
    on the server's statement log for the block, which has one line per
    statement, counted here — minus those of ``exclude_pids`` (the bench's own
    polling connection). Redis: ``total_reads_processed``, one per request a
    client sent (a pipeline is one; blocking reads too). Both include what the
    idle parts do meanwhile (heartbeats, the promoter's polls): a small share
    over a run of a thousand jobs.
    """

    redis_client: Any
    log_path: Path | None = None
    set_logging: Callable[[str], None] | None = None
    exclude_pids: set[int] = field(default_factory=set)
    postgres: int | None = None
    redis: int | None = None
    _offset: int = 0
    _reads_before: int = 0

    def _reads(self) -> int:
        return int(self.redis_client.info("stats")["total_reads_processed"])

    def _statements(self) -> int:
        assert self.log_path is not None
        with self.log_path.open("rb") as log:
            log.seek(self._offset)
            found = STATEMENT_LINE.findall(log.read())
        return sum(1 for pid in found if int(pid) not in self.exclude_pids)

    def __enter__(self) -> RoundTrips:
        if self.log_path is not None and self.set_logging is not None:
            self.set_logging("all")
            self._offset = self.log_path.stat().st_size
        self._reads_before = self._reads()
        return self

    def __exit__(self, *exc: object) -> None:
        self.redis = self._reads() - self._reads_before - 1  # less this INFO's own read
        if self.log_path is not None and self.set_logging is not None:
            self.set_logging("none")
            self.postgres = self._statements()

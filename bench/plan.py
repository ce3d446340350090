"""How big each figure is, in full and ``--quick`` runs, and the context figures run in."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.env import BenchEnv


@dataclass(frozen=True)
class Sizes:
    """Workload sizes; every load is bounded in count and in time."""

    noop_jobs: int  # P1 jobs per repetition
    retry_jobs: int  # P2 jobs per repetition
    warmup_jobs: int  # unmeasured jobs before each P1/P2 repetition
    http_seconds: float  # P3 measured seconds per repetition and endpoint
    http_warmup_seconds: float
    http_concurrency: int  # P3 closed-loop client connections
    http_workers: int  # gunicorn sync workers (keel up runs 2)
    recipients: int  # P4 campaign size
    chunk_size: int  # P4 recipients per chunk job
    records: int  # P5 job records in the reports queue
    health_calls: int  # P5 calls per repetition
    naive_calls: int  # P5 calls of the full-scan reference per repetition
    worker_concurrency: int = 2  # celery -c for bare and Keel workers alike
    pickup_seconds: float = 10  # P11 paced seconds per load level, system and repetition


Batch = tuple[dict, Callable[[], object]]  # a batch's figures, and how to remove what it left


def batch_timeout(n: int) -> float:
    """How long a batch of ``n`` jobs may take: at 10 jobs/s something is broken, not slow."""
    return 60 + n / 10


FULL = Sizes(
    noop_jobs=2000,
    retry_jobs=1000,
    warmup_jobs=50,
    http_seconds=10,
    http_warmup_seconds=1,
    http_concurrency=4,
    http_workers=2,
    recipients=1_000_000,
    chunk_size=5000,
    records=1_000_000,
    health_calls=200,
    naive_calls=10,
    pickup_seconds=10,
)
QUICK = Sizes(
    noop_jobs=200,
    retry_jobs=100,
    warmup_jobs=10,
    http_seconds=2,
    http_warmup_seconds=0.5,
    http_concurrency=4,
    http_workers=2,
    recipients=20_000,
    chunk_size=5000,
    records=20_000,
    health_calls=200,
    naive_calls=5,
    pickup_seconds=1,
)


@dataclass
class Run:
    """What a figure needs: the servers, the sizes and how often to repeat."""

    env: BenchEnv
    sizes: Sizes
    repeat: int
    quick: bool
    tag: str = ""

    def __post_init__(self) -> None:
        # Unique per run: bench data never collides with an earlier run's on shared servers.
        self.tag = self.tag or f"bench-{int(time.time() * 1000):x}"

    def log(self, message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)

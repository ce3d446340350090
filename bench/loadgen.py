"""A small closed-loop HTTP load generator, pure Python, so a fresh machine needs nothing else.

``concurrency`` threads each keep one connection (reopened when the server
closes it, as gunicorn's sync workers do after every response) and send the
next request as soon as the previous answer arrived, until ``duration_s``
runs out or ``max_requests`` were sent. Latency is measured per request,
connect included. The generator's own CPU time is reported: it shares the
machine with the server, and a reader should know how much it took.
"""

from __future__ import annotations

import http.client
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.stats import percentile

# (method, path, body or None, headers) for request number ``i`` of thread ``t``
RequestFactory = Callable[[int, int], tuple[str, str, bytes | None, dict[str, str]]]


@dataclass
class LoadResult:
    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    errors: int = 0
    cpu_s: float = 0.0

    @property
    def ok(self) -> int:
        return sum(n for status, n in self.statuses.items() if 200 <= status < 300)

    @property
    def rps(self) -> float:
        """Successful responses per second."""
        return self.ok / self.duration_s if self.duration_s else 0.0

    def p(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def summary(self) -> dict:
        return {
            "requests": len(self.latencies_ms),
            "ok": self.ok,
            "errors": self.errors,
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "rps": self.rps,
            "p50_ms": self.p(50),
            "p99_ms": self.p(99),
            "max_ms": max(self.latencies_ms, default=0.0),
            "duration_s": self.duration_s,
            "client_cpu_s": self.cpu_s,
        }


def run_load(
    host: str,
    port: int,
    make: RequestFactory,
    *,
    duration_s: float,
    concurrency: int,
    max_requests: int = 2_000_000,
) -> LoadResult:
    """Drive the server for ``duration_s`` with ``concurrency`` connections; bounded both ways."""
    per_thread = max_requests // concurrency
    results = [LoadResult(duration_s) for _ in range(concurrency)]
    gate = threading.Barrier(concurrency + 1)
    stop_at: list[float] = [0.0]

    def worker(t: int) -> None:
        out = results[t]
        conn = http.client.HTTPConnection(host, port, timeout=10)
        gate.wait()
        i = 0
        while i < per_thread and time.perf_counter() < stop_at[0]:
            method, path, body, headers = make(t, i)
            i += 1
            began = time.perf_counter()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                out.errors += 1
                conn.close()
                continue
            out.latencies_ms.append((time.perf_counter() - began) * 1000)
            out.statuses[response.status] += 1
            if response.will_close:
                conn.close()
        conn.close()

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(concurrency)]
    for thread in threads:
        thread.start()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    stop_at[0] = began + duration_s
    gate.wait()
    for thread in threads:
        thread.join(timeout=duration_s + 30)
    elapsed = time.perf_counter() - began
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    total = LoadResult(elapsed)
    for part in results:
        total.latencies_ms.extend(part.latencies_ms)
        total.statuses.update(part.statuses)
        total.errors += part.errors
    total.cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (
        cpu_after.ru_stime - cpu_before.ru_stime
    )
    return total

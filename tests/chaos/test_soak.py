"""Scenario 11: a leak-finding soak — mixed load at about half the measured capacity,
under worker kills, Redis restarts and provider faults, for ``KEEL_SOAK_SECONDS``
(600 by default; slow tier), and a 2-minute run of the same soak in the stack tier.

Why: each fault alone is covered by its own scenario; a long mixed run finds
what they do together (a kill during a republish, a restart during a chord,
retries under a flaky provider) and what only shows up after many rounds: a
process that keeps growing, connections or descriptors that are never given
back, keys or rows nobody removes, latency that creeps up.

The load, against a real gunicorn (the API as ``keel up`` serves it), beat
and two ``celery worker`` processes (2 pool processes each) on the
``reports`` and ``notifications`` queues:

- first a burst of report jobs measures the pool's capacity (jobs/s, burst
  submitted → all completed); the soak then submits reports at half of it;
- of those reports: ~10 % fail their first run (``failUntilAttempt``, retried
  by backoff), ~10 % are delayed (``POST /reports/scheduled``, 5-30 s ahead),
  ~5 % repeat the previous request (deduplicated), ~4 % are delayed 2-5 min
  and cancelled a few seconds later (``DELETE /jobs/<id>``: always 200), ~3 %
  are cancelled right after the POST (200; or, if a worker was faster, 202 — its run is
  aborted and it must end cancelled, never completed — or 409 once it has finished, and
  then it must have completed);
- two job schedulers (``PUT /schedulers/<id>``, every 15 s and 40 s) fire
  report jobs through beat; a campaign starts every ``max(20, seconds/10)`` s;
- one worker is SIGKILLed every 15-35 s and replaced; the other (the
  *survivor*) is never killed, so its memory and descriptors are measured over
  the whole run; Redis restarts empty every ``max(90, seconds/4)`` s.

Pass: every accepted report completes, once, one artifact per operation key;
every campaign completes and verifies against the provider's ledger; every
cancelled job stays cancelled and never runs; each scheduler fired and every
job it fired completed; and no series grows without bound.

Series, sampled every ``max(10, min(60, seconds/30))`` s (≥ 10 samples even
for a short run), per role, summed over the role's live processes (main
process and pool children; a replaced worker is a new set of processes, so
per-role sums, not pids): RSS and PSS (MB), open descriptors and threads of
``worker`` (the survivor), ``worker_replaced`` (the one killed on the timer:
only its ceiling is judged), ``beat`` and ``web`` (gunicorn master and
workers); Postgres client connections; Redis ``used_memory`` and ``DBSIZE``;
live and dead tuples of ``jobs``, ``job_count_deltas``, ``job_counts`` and
``dedup_claims``; p99 of POST latency and of the wait of first runs
(claimed - max(created, run_at)) in each interval. They are kept in
``bench/results/soak-<UTC stamp>.{csv,json,svg,md}`` (``KEEL_SOAK_RESULTS``
to put them elsewhere; the stack-tier run writes to its tmp dir).

Thresholds (``LIMITS``; ``tests/support/soak_series`` judges): a
least-squares slope over the second half of the samples (warm-up left out),
per hour, must stay under the figure below, and the second half may not pass
the first half's peak by more than the headroom. They are set to catch a leak
over an hour, not noise: the survivor handles ~15,000 jobs an hour at this
rate, so a leak of 2 KB a job is 30 MB/h; one descriptor or thread per Redis
reconnection or per kill is dozens an hour.

=================================  ===========  =========================
series                             slope ≤ /h   headroom over 1st half
=================================  ===========  =========================
worker / web RSS, PSS              30 MB        30 MB
beat RSS, PSS                      10 MB        10 MB
worker_replaced RSS                —            ceiling 1500 MB
fds (each role)                    10           16 worker, 12 web, 6 beat
threads (each role)                5            4
Postgres connections               5            10; ceiling 90
Redis used_memory                  30 MB        40 MB
Redis keys                         300          300
jobs live rows                     3,000        3,000 (scheduler, campaign records kept)
dead tuples (each table)           —            10,000 + 2x 1st-half peak
POST p99                           200 ms       —   (restart intervals left out)
first-run wait p99                 10 s         —   (restart intervals left out)
=================================  ===========  =========================

The stack-tier run (120 s) judges ceilings and headroom only, not slopes: a
slope over two minutes of samples is noise (a warm-up, one vacuum, one
restart). What it can tell in 2 minutes — descriptors, threads, connections
and keys not climbing past their first-half peak by more than the headroom —
it asserts; the slow run asserts the slopes too. Run with ``-s`` for figures::

    KEEL_SOAK_SECONDS=3600 .venv/bin/pytest -m slow tests/chaos -k soak -s
"""

from __future__ import annotations

import math
import os
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
import requests
from sqlalchemy import text

from tasks.jobs.schedule.schedulers import fire_prefix
from tasks.notifications.verify import verify
from tasks.platform.db import transaction
from tasks.reports.operation_key import operation_key
from tests.support.chaos import artifact_rows, job_rows, settle, stragglers
from tests.support.client import bearer, unique
from tests.support.outages import embedded_redis
from tests.support.soak_series import Limit, Series, judge_all, percentile, write_series
from tests.support.stack import PROJECT_ROOT, BeatProcess, WebProcess, sandbox_admin_headers

SOAK_SECONDS = float(os.environ.get("KEEL_SOAK_SECONDS", "600"))
SHORT_SOAK_SECONDS = 120.0  # one Redis restart (at 90 s), three to five worker kills
SOAK_SEED = int(os.environ.get("KEEL_SOAK_SEED", "11"))
REPORTER = ("acme", "soak")
OPERATOR_ID = ("acme", "soak-operator")
WORKER_ENV = {"KEEL_LOCK_DURATION_S": "10"}  # a killed worker's jobs are claimable 10 s later
QUEUES = "reports,notifications"
CONCURRENCY = 2
CAPACITY_BURST = 80
SCHEDULER_EVERY_S = (15, 40)
TABLES = ("jobs", "job_count_deltas", "job_counts", "dedup_claims")
ROLES = ("worker", "worker_replaced", "beat", "web")
RESTART = "redis-restart"


def _role_limits() -> list[Limit]:
    limits: list[Limit] = []
    for role, mb, fds in (("worker", 30, 16), ("web", 30, 12), ("beat", 10, 6)):
        limits += [
            Limit(f"{role}.rss_mb", "MB", slope_per_hour=mb, headroom=mb),
            Limit(f"{role}.pss_mb", "MB", slope_per_hour=mb, headroom=mb),
            Limit(f"{role}.fds", "fds", slope_per_hour=10, headroom=fds, short=True),
            Limit(f"{role}.threads", "threads", slope_per_hour=5, headroom=4, short=True),
        ]
    limits.append(Limit("worker_replaced.rss_mb", "MB", ceiling=1500, short=True))
    return limits


LIMITS: list[Limit] = [
    *_role_limits(),
    Limit("pg.connections", "conns", slope_per_hour=5, headroom=10, ceiling=90, short=True),
    Limit("redis.used_memory_mb", "MB", slope_per_hour=30, headroom=40),
    Limit("redis.keys", "keys", slope_per_hour=300, headroom=300, short=True),
    Limit("jobs.live", "rows", slope_per_hour=3000, headroom=3000),
    Limit("api.post_p99_ms", "ms", slope_per_hour=200, skip_marked=frozenset({RESTART})),
    Limit("jobs.wait_p99_s", "s", slope_per_hour=10, skip_marked=frozenset({RESTART})),
]


def dead_tuple_limits(series: Series) -> list[Limit]:
    """Dead tuples come and go with autovacuum: bounded by twice the first half's peak."""
    limits = []
    for table in TABLES:
        column = [v for v in series.values.get(f"{table}.dead", []) if not math.isnan(v)]
        peak = max(column[: len(column) // 2] or [0.0])
        limits.append(Limit(f"{table}.dead", "rows", headroom=10_000 + peak))
    return limits


class Api:
    """The served API over HTTP, timing every POST and DELETE."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = requests.Session()
        self.statuses: Counter = Counter()
        self.latencies: list[float] = []
        self.window: list[float] = []  # latencies since the last sample
        self.lock = threading.Lock()

    def call(self, method: str, path: str, headers: dict, body: dict | None = None):
        started = time.monotonic()
        response = self.http.request(
            method, f"{self.url}{path}", json=body, headers=headers, timeout=30
        )
        elapsed = time.monotonic() - started
        if method == "POST":
            with self.lock:
                self.latencies.append(elapsed)
                self.window.append(elapsed)
        self.statuses[(method, response.status_code)] += 1
        return response.status_code, (response.json() if response.content else {})

    def take_window(self) -> list[float]:
        with self.lock:
            taken, self.window = self.window, []
        return taken


class Soak:
    """The running soak: what it submitted, cancelled and broke."""

    def __init__(self, api: Api, rng: random.Random) -> None:
        self.api = api
        self.rng = rng
        self.reporter = bearer(*REPORTER)
        self.operator = bearer(*OPERATOR_ID, roles=("operator",))
        self.reports: dict[str, str] = {}  # job id → operation key: each must complete once
        self.cancelled: dict[str, str] = {}  # job id → operation key: each must never run
        self.aborted: dict[str, str] = {}  # running when cancelled: each must end cancelled
        self.to_cancel: list[tuple[float, str, str]] = []  # (when, job id, key)
        self.campaigns: dict[str, int] = {}
        self.schedulers: dict[str, int] = {}  # scheduler id → every (ms)
        self.fired: dict[str, int] = {}  # scheduler id → its iterationCount when removed
        self.kinds: Counter = Counter()
        self.cancel_answers: Counter = Counter()
        self.deduplicated = 0
        self.kills = 0
        self.restarts = 0
        self.last_report: tuple[str, int] | None = None

    def submit_report(self) -> None:
        """A report of a random kind (see the module's docstring for the mix)."""
        roll = self.rng.random()
        report_id, rows = unique("soak"), self.rng.randint(1, 5000)
        body: dict[str, Any] = {"reportId": report_id, "rows": rows}
        path, kind = "/api/v1/reports", "plain"
        if self.last_report and roll < 0.05:
            report_id, rows = self.last_report
            body, kind = {"reportId": report_id, "rows": rows}, "repeat"
        elif roll < 0.15:
            body["failUntilAttempt"], kind = 1, "retry"
        elif roll < 0.25:
            path, kind = "/api/v1/reports/scheduled", "delayed"
            body["runAt"] = in_seconds(self.rng.uniform(5, 30))
        elif roll < 0.29:
            path, kind = "/api/v1/reports/scheduled", "delayed-cancel"
            body["runAt"] = in_seconds(self.rng.uniform(120, 300))
        elif roll < 0.32:
            kind = "cancel-at-once"
        status, answer = self.api.call("POST", path, self.reporter, body)
        if status != 202:
            return
        self.kinds[kind] += 1
        self.deduplicated += answer.get("deduplicated", False)
        job_id, key = answer["jobId"], operation_key(*REPORTER, report_id, rows)
        if kind in ("plain", "retry"):  # a repeat must not land on a job to be cancelled
            self.last_report = (report_id, rows)
        if kind == "delayed-cancel":
            self.to_cancel.append((time.monotonic() + self.rng.uniform(2, 10), job_id, key))
        elif kind == "cancel-at-once":
            self.cancel(job_id, key, must=False)
        else:
            self.reports[job_id] = key

    def cancel(self, job_id: str, key: str, *, must: bool) -> None:
        """Cancel a job: a delayed one must answer 200; a waiting one may have started (202:
        its run is aborted) or even finished (409)."""
        status, _ = self.api.call("DELETE", f"/api/v1/jobs/{job_id}", self.reporter)
        self.cancel_answers[status] += 1
        if status == 200:
            self.cancelled[job_id] = key
        elif status == 202 and not must:
            self.aborted[job_id] = key  # it was running: aborted, it must end cancelled
        elif status == 409 and not must:
            self.reports[job_id] = key  # it finished before the cancel: it must complete
        else:
            self.cancelled[job_id] = key  # counted as a failure below (answer recorded)
            self.cancel_answers[f"unexpected {status} for a delayed job"] += 1

    def cancel_due(self) -> None:
        now = time.monotonic()
        due = [entry for entry in self.to_cancel if entry[0] <= now]
        self.to_cancel = [entry for entry in self.to_cancel if entry[0] > now]
        for _, job_id, key in due:
            self.cancel(job_id, key, must=True)

    def start_campaign(self) -> None:
        recipients = self.rng.choice([3_000, 8_000, 15_000, 25_000])
        body = {
            "name": "soak",
            "category": "marketing",
            "template": "Hi {seq}!",
            "recipientCount": recipients,
            "chunkSize": self.rng.choice([1_000, 2_500, 5_000]),
        }
        status, answer = self.api.call("POST", "/api/v1/campaigns", self.operator, body)
        if status == 202:
            self.campaigns[answer["campaignId"]] = recipients

    def create_schedulers(self) -> None:
        for every_s in SCHEDULER_EVERY_S:
            scheduler_id = f"soak-{uuid.uuid4().hex[:8]}-{every_s}s"
            body = {
                "every": every_s * 1000,
                "template": {
                    "name": "report.generate",
                    "data": {"reportId": scheduler_id, "rows": every_s},
                },
            }
            status, answer = self.api.call(
                "PUT", f"/api/v1/schedulers/{scheduler_id}", self.operator, body
            )
            assert status == 200, answer
            self.schedulers[scheduler_id] = every_s * 1000

    def scheduler_figures(self) -> dict[str, dict[str, Any]]:
        """Per scheduler: how often it fired, and the states of the jobs it fired that still
        have a record (retention trims completed report records, failed ones are archived)."""
        figures = {}
        for scheduler_id in self.schedulers:
            prefix = fire_prefix(OPERATOR_ID[0], scheduler_id) + "%"
            with transaction() as session:
                states = session.execute(
                    text("SELECT state, count(*) FROM jobs WHERE id LIKE :prefix GROUP BY state"),
                    {"prefix": prefix},
                ).all()
                archived = session.execute(
                    text("SELECT count(*) FROM failed_jobs_archive WHERE id LIKE :prefix"),
                    {"prefix": prefix},
                ).scalar_one()
            figures[scheduler_id] = {
                "fired": self.fired.get(scheduler_id, 0),
                "states": dict(states),
                "archived_failures": archived,
            }
        return figures

    def remove_schedulers(self) -> None:
        """Remove the soak's schedulers, noting how often each fired."""
        for scheduler_id in self.schedulers:
            path = f"/api/v1/schedulers/{scheduler_id}"
            status, view = self.api.call("GET", path, self.operator)
            if status == 200:
                self.fired[scheduler_id] = view["iterationCount"]
            self.api.call("DELETE", path, self.operator)


def in_seconds(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def faults(sandbox, **settings) -> None:
    response = requests.put(
        f"{sandbox.url}/admin/faults", json=settings, headers=sandbox_admin_headers(), timeout=5
    )
    assert response.status_code == 200, response.text


class Sampler(threading.Thread):
    """Every ``interval`` s, one sample of every series; every 2 s, the first-run waits."""

    def __init__(self, api: Api, roles: dict[str, Callable[[], list[int]]], interval: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.api = api
        self.roles = roles
        self.interval = interval
        self.series = Series()
        self.marks: set[str] = set()
        self.waits: list[float] = []
        self.all_waits: list[float] = []
        self.seen: set[str] = set()
        self.since = datetime.now(UTC) - timedelta(seconds=5)
        self.stopping = threading.Event()
        self.started_at = time.monotonic()
        self.errors: Counter = Counter()
        self.redis = redis.Redis.from_url(
            os.environ["KEEL_REDIS_URL"], socket_timeout=2, socket_connect_timeout=2
        )
        self.lock = threading.Lock()

    def mark(self, name: str) -> None:
        with self.lock:
            self.marks.add(name)

    def run(self) -> None:
        next_sample = time.monotonic() + self.interval
        while not self.stopping.wait(2.0):
            self.collect_waits()
            if time.monotonic() >= next_sample:
                self.sample()
                next_sample += self.interval

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)

    def collect_waits(self) -> None:
        """First runs claimed since the last look: claimed - max(created, run_at), seconds."""
        try:
            with transaction() as session:
                rows = session.execute(
                    text(
                        "SELECT id, processed_on, EXTRACT(EPOCH FROM processed_on - "
                        "GREATEST(created_at, COALESCE(run_at, created_at))) FROM jobs "
                        "WHERE queue = 'reports' AND tenant_id = :tenant "
                        "AND attempts_started = 1 AND processed_on > :since"
                    ),
                    {"tenant": REPORTER[0], "since": self.since},
                ).all()
        except Exception as exc:  # Postgres is never taken down here; count, don't die
            self.errors[f"waits: {type(exc).__name__}"] += 1
            return
        for job_id, processed_on, wait in rows:
            if job_id not in self.seen:
                self.seen.add(job_id)
                self.waits.append(float(wait))
                self.all_waits.append(float(wait))
            self.since = max(self.since, processed_on - timedelta(seconds=5))

    def sample(self) -> None:
        values: dict[str, float] = {}
        for role, pids in self.roles.items():
            values.update(process_figures(role, pids()))
        values.update(self.database_figures())
        values.update(self.redis_figures())
        latencies = self.api.take_window()
        values["api.post_p99_ms"] = percentile(latencies, 99) * 1000
        values["api.posts"] = len(latencies)
        values["jobs.wait_p99_s"] = percentile(self.waits, 99)
        values["jobs.first_runs"] = len(self.waits)
        self.waits = []
        with self.lock:
            marks, self.marks = self.marks, set()
        self.series.add(time.monotonic() - self.started_at, values, marks)

    def database_figures(self) -> dict[str, float]:
        values: dict[str, float] = {}
        try:
            with transaction() as session:
                values["pg.connections"] = session.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE backend_type = 'client backend'"
                    )
                ).scalar_one()
                for table, live, dead in session.execute(
                    text(
                        "SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables "
                        "WHERE relname = ANY(:tables)"
                    ),
                    {"tables": list(TABLES)},
                ):
                    values[f"{table}.live"] = live
                    values[f"{table}.dead"] = dead
        except Exception as exc:
            self.errors[f"postgres: {type(exc).__name__}"] += 1
        return values

    def redis_figures(self) -> dict[str, float]:
        try:
            memory = self.redis.info("memory")
            return {
                "redis.used_memory_mb": memory["used_memory"] / 2**20,
                "redis.keys": self.redis.dbsize(),
            }
        except redis.RedisError as exc:  # restarting: a gap in the series
            self.errors[f"redis: {type(exc).__name__}"] += 1
            return {}


def process_tree(pid: int | None) -> list[int]:
    if pid is None:
        return []
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return []


def process_figures(role: str, pids: list[int]) -> dict[str, float]:
    """RSS and PSS (MB), descriptors and threads, summed over the role's live processes."""
    rss = pss = fds = threads = count = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue  # killed, not reaped yet
                memory = process.memory_full_info()
                rss += memory.rss / 2**20
                pss += memory.pss / 2**20
                fds += process.num_fds()
                threads += process.num_threads()
                count += 1
        except psutil.Error:
            continue  # it ended between listing and reading (a kill): not counted
    if not count:
        return {}
    return {
        f"{role}.rss_mb": rss,
        f"{role}.pss_mb": pss,
        f"{role}.fds": fds,
        f"{role}.threads": threads,
        f"{role}.processes": count,
    }


def campaign_state(api: Api, campaign_id: str, operator: dict) -> str:
    _, answer = api.call("GET", f"/api/v1/campaigns/{campaign_id}", operator)
    return answer.get("state", "unknown")


def campaign_job_states(campaign_ids: list[str]) -> Counter:
    """States of every job of these campaigns (plan, chunk loads, groups, sends, finalize)."""
    with transaction() as session:
        rows = session.execute(
            text(
                "SELECT state, count(*) FROM jobs WHERE queue = 'notifications' "
                "AND data->>'campaignId' = ANY(:ids) GROUP BY state"
            ),
            {"ids": campaign_ids},
        ).all()
    return Counter(dict(rows))


def cancelled_but_ran(cancelled: dict[str, str]) -> dict[str, str]:
    """Cancelled jobs whose record is not cancelled, that ran, or whose report was stored."""
    rows = job_rows(list(cancelled))
    stored = artifact_rows(list(cancelled.values()))
    wrong = {}
    for job_id, key in cancelled.items():
        row = rows.get(job_id)
        if row is not None and (row["state"] != "cancelled" or row["runs"]):
            wrong[job_id] = f"state {row['state']}, {len(row['runs'])} runs"
        elif key in stored:
            wrong[job_id] = "its report was stored"
    return wrong


def aborted_but_not_cancelled(aborted: dict[str, str]) -> dict[str, str]:
    """Jobs whose run was aborted that did not end cancelled (or had a run complete)."""
    rows = job_rows(list(aborted))
    wrong = {}
    for job_id in aborted:
        row = rows.get(job_id)
        if row is None:
            continue  # (retention may have trimmed a cancelled record)
        completed = [run for run in row["runs"] if run.get("outcome") == "completed"]
        if row["state"] != "cancelled" or completed:
            wrong[job_id] = f"state {row['state']}, {len(completed)} completed runs"
    return wrong


def wait_until(predicate, timeout: float, interval: float = 1.0):
    """Poll ``predicate`` until it holds or ``timeout`` s passed; the caller asserts after."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return value


def measure_capacity(soak: Soak) -> float:
    """Report jobs per second the pool completes: a burst, submitted → all completed."""
    started = time.monotonic()
    burst: dict[str, str] = {}
    for _ in range(CAPACITY_BURST):
        report_id, rows = unique("cap"), soak.rng.randint(1, 5000)
        status, answer = soak.api.call(
            "POST", "/api/v1/reports", soak.reporter, {"reportId": report_id, "rows": rows}
        )
        assert status == 202, answer
        burst[answer["jobId"]] = operation_key(*REPORTER, report_id, rows)
    result = settle(burst, timeout=120, interval=0.2)
    assert result.clean, (result.figure(), stragglers(result))
    soak.reports.update(burst)
    return CAPACITY_BURST / (time.monotonic() - started)


def results_dir(default: Path) -> Path:
    return Path(os.environ.get("KEEL_SOAK_RESULTS", default))


def run_soak(stack, spawn, sandbox, seconds: float, *, slopes: bool, results: Path) -> None:
    embedded_redis(stack)  # skip against an external Redis: it is not ours to restart
    web = WebProcess(stack.home)
    beat = BeatProcess(stack.home, unique("soak"))
    try:
        soak_with(stack, spawn, sandbox, web, beat, seconds, slopes=slopes, results=results)
    finally:
        beat.stop()
        web.stop()


def soak_with(stack, spawn, sandbox, web, beat, seconds, *, slopes: bool, results: Path) -> None:
    """The soak against ``web`` and ``beat`` (started here; the caller stops them)."""
    embedded_redis(stack)  # skip against an external Redis: it is not ours to restart
    rng = random.Random(SOAK_SEED)
    # Given a flaky provider, the API served by gunicorn, beat, and two workers on the
    # reports and notifications queues: a survivor, and one killed and replaced on a timer
    faults(
        sandbox,
        errorRate=0.05,
        dropResponseRate=0.02,
        latencyMs=2,
        latencyJitterMs=10,
        seed=rng.randrange(10_000),
    )
    web.start()
    beat.start()

    def start_worker(prefix: str):
        return spawn(prefix, concurrency=CONCURRENCY, queues=QUEUES, extra_env=WORKER_ENV)

    survivor = start_worker("soak-survivor")
    replaced = [start_worker("soak-replaced")]

    def pid(process) -> int | None:
        return process.process.pid if process.process is not None else None

    api = Api(web.url)
    soak = Soak(api, rng)
    sampler: Sampler | None = None
    started = time.monotonic()
    try:
        capacity = measure_capacity(soak)
        rate = capacity / 2
        soak.create_schedulers()
        interval = max(10.0, min(60.0, seconds / 30))
        sampler = Sampler(
            api,
            {
                "worker": lambda: process_tree(pid(survivor)),
                "worker_replaced": lambda: process_tree(pid(replaced[0])),
                "beat": lambda: process_tree(pid(beat)),
                "web": lambda: process_tree(pid(web)),
            },
            interval,
        )
        sampler.start()
        started = time.monotonic()
        end = started + seconds
        restart_every = max(90.0, seconds / 4)
        next_restart = started + restart_every
        campaign_every = max(20.0, seconds / 10)
        next_campaign, next_kill = started, started + rng.uniform(15, 30)
        next_report = started
        # When reports, cancels, campaigns and scheduler fires keep coming while one
        # worker is SIGKILLed at random (and replaced) and Redis restarts empty
        while (now := time.monotonic()) < end:
            if now >= next_report:
                soak.submit_report()
                next_report = max(next_report + 1 / rate, now - 1.0)  # no catch-up burst
            soak.cancel_due()
            if now >= next_campaign:
                soak.start_campaign()
                next_campaign += campaign_every
            if now >= next_kill:
                replaced[0].kill()
                soak.kills += 1
                replaced[0] = start_worker("soak-replaced")
                next_kill = time.monotonic() + rng.uniform(15, 35)
            if now >= next_restart and now < end - 20:
                sampler.mark(RESTART)
                stack.restart_redis()
                soak.restarts += 1
                next_restart += restart_every
            time.sleep(max(0.0, min(0.05, next_report - time.monotonic())))
        for _, job_id, key in soak.to_cancel:  # due after the end: cancelled now
            soak.cancel(job_id, key, must=True)
        soak.to_cancel = []
        sampler.sample()  # the last interval's figures
        survivor_alive = survivor.process is not None and survivor.process.poll() is None
    finally:
        if sampler is not None:
            sampler.stop()
        faults(sandbox)
        soak.remove_schedulers()
    load_s = time.monotonic() - started
    # Then every accepted report completes, once, with one artifact per operation key
    result = settle(soak.reports, timeout=240, interval=2)
    # and every campaign completes, every one of its jobs completed, and verifies
    ids = list(soak.campaigns)
    operator = soak.operator
    wait_until(lambda: all(campaign_state(api, c, operator) == "completed" for c in ids), 420, 2)
    unfinished = {c: campaign_state(api, c, operator) for c in ids}
    unfinished = {c: s for c, s in unfinished.items() if s != "completed"}
    wait_until(lambda: set(campaign_job_states(ids)) <= {"completed"}, 120, 1)
    job_states = campaign_job_states(ids)
    checks = {c: verify(c) for c in ids if c not in unfinished}
    failed_checks = {c: [k.name for k in found if not k.ok] for c, found in checks.items()}
    failed_checks = {c: names for c, names in failed_checks.items() if names}
    landed = sum(found[2].figures["landed"] for found in checks.values())
    # and no cancelled job ran, every aborted one ended cancelled (its run stopped by itself
    # as it ended, by its worker after the grace period, or by the stalled check); each
    # scheduler fired, and every job it fired completed
    ran_anyway = cancelled_but_ran(soak.cancelled)
    wait_until(lambda: not aborted_but_not_cancelled(soak.aborted), 90, 1)
    not_aborted = aborted_but_not_cancelled(soak.aborted)
    wait_until(
        lambda: all(set(f["states"]) <= {"completed"} for f in soak.scheduler_figures().values()),
        120,
        2,
    )
    fired = soak.scheduler_figures()
    settled_s = time.monotonic() - started - load_s
    # and no series grows without bound
    assert sampler is not None
    series = sampler.series
    limits = [*LIMITS, *dead_tuple_limits(series)]
    verdicts = judge_all(series, limits, slopes=slopes)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    meta = {
        "seconds": seconds,
        "seed": SOAK_SEED,
        "interval_s": sampler.interval,
        "capacity_jobs_s": round(capacity, 2),
        "rate_jobs_s": round(rate, 2),
        "slopes_judged": slopes,
        "kills": soak.kills,
        "redis_restarts": soak.restarts,
        "cpus": os.cpu_count(),
    }
    paths = write_series(series, verdicts, meta, results, f"soak-{stamp}")
    if not survivor_alive:  # kept beside the series: why the worker no one killed ended
        kept = results / f"soak-{stamp}-survivor.log"
        kept.write_bytes(survivor.log_path.read_bytes())
        paths.append(kept)
    waits = sampler.all_waits
    print(
        f"\nsoak: {load_s:.0f} s of load (+{settled_s:.0f} s to settle), seed {SOAK_SEED}, "
        f"capacity {capacity:.1f} reports/s measured, soak at {rate:.1f}/s; "
        f"{soak.kills} workers SIGKILLed, {soak.restarts} Redis restart(s), provider faults on; "
        f"survivor {'alive' if survivor_alive else 'DIED: ' + survivor.log_tail(5)}\n"
        f"  reports: {len(soak.reports)} to complete ({dict(soak.kinds)}; "
        f"{soak.deduplicated} deduplicated answers); {result.figure()}\n"
        f"  cancels: {len(soak.cancelled)} cancelled (answers {dict(soak.cancel_answers)}), "
        f"{len(ran_anyway)} ran anyway; {len(soak.aborted)} aborted running, "
        f"{len(not_aborted)} not ended cancelled\n"
        f"  schedulers: {fired}\n"
        f"  campaigns: {len(ids)} started, {len(ids) - len(unfinished)} completed, "
        f"{len(checks) - len(failed_checks)} verified (4 invariants each), "
        f"{sum(soak.campaigns.values())} recipients, {landed} messages landed; "
        f"campaign jobs by state {dict(job_states)}\n"
        f"  API: {dict(api.statuses)}, POST median "
        f"{statistics.median(api.latencies) * 1000:.0f} ms, p99 "
        f"{percentile(api.latencies, 99) * 1000:.0f} ms, slowest "
        f"{max(api.latencies) * 1000:.0f} ms; first-run wait median "
        f"{statistics.median(waits or [math.nan]):.2f} s, p99 {percentile(waits, 99):.2f} s\n"
        f"  series: {len(series)} samples every {sampler.interval:.0f} s "
        f"({'slopes judged' if slopes else 'ceilings and headroom only'}); "
        f"sampler errors {dict(sampler.errors)}\n"
        + "\n".join(f"    {v.line()}" for v in verdicts)
        + "\n  kept in "
        + ", ".join(str(_shown(p)) for p in paths)
    )
    assert result.clean, (result.figure(), stragglers(result))
    assert result.duplicate_artifacts == 0 and not result.lost
    assert unfinished == {}
    assert failed_checks == {}
    assert set(job_states) <= {"completed"}, job_states
    assert ran_anyway == {}, ran_anyway
    assert not_aborted == {}, not_aborted
    assert not [k for k in soak.cancel_answers if str(k).startswith("unexpected")]
    posts = {status for (method, status) in api.statuses if method == "POST"}
    assert posts == {202}, api.statuses
    assert all(
        f["fired"] >= max(1, int(0.5 * load_s / (soak.schedulers[i] / 1000)))
        and set(f["states"]) <= {"completed"}
        and f["archived_failures"] == 0
        for i, f in fired.items()
    ), fired
    assert survivor_alive, survivor.log_tail()
    assert soak.kills >= 1 and soak.restarts >= 1 and ids and soak.cancelled
    assert len(series) >= 10, len(series)
    assert [v.line() for v in verdicts if not v.ok] == []


def _shown(path: Path) -> Path:
    try:
        return path.relative_to(PROJECT_ROOT)
    except ValueError:
        return path


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 1500)
def test_soak_finds_no_leak_under_kills_redis_restarts_and_provider_faults(stack, spawn, sandbox):
    """Mixed load for KEEL_SOAK_SECONDS: nothing lost or doubled, no series grows (slopes)."""
    run_soak(
        stack,
        spawn,
        sandbox,
        SOAK_SECONDS,
        slopes=True,
        results=results_dir(PROJECT_ROOT / "bench" / "results"),
    )


@pytest.mark.slow  # a soak: with the 10-minute one, out of the default run
@pytest.mark.timeout(SHORT_SOAK_SECONDS + 1200)
def test_two_minute_soak_stays_bounded_under_kills_a_redis_restart_and_provider_faults(
    stack, spawn, sandbox, tmp_path
):
    """The same soak for 2 minutes (stack tier): nothing lost or doubled, fds/threads/
    connections/keys under their ceilings and headroom (no slopes: too short to mean much)."""
    run_soak(stack, spawn, sandbox, SHORT_SOAK_SECONDS, slopes=False, results=results_dir(tmp_path))

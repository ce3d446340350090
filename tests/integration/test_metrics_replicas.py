"""Three web servers scraped one by one, as Prometheus scrapes Kubernetes pods
(``KEEL_METRICS_SCRAPE=each``, ``web.metrics_lease``).

Each server is a real gunicorn. Their three scrapes become the input series of a
``promtool test rules`` file, one ``instance`` each, and promtool evaluates the shipped
dashboard's queries and alert rules over them: the sums give the true backlog (what one
server serves, and Postgres's own count), not three times it, and a server that stops
answering fires ``KeelScrapeTargetDown``.

The backlog alerts (``KeelBacklogGrowing``, ``KeelBacklogStale``,
``KeelDelayedJobsNotPromoted``, ``KeelDeadLettersGrowing``) and the dashboard's ``rate()``
panels are evaluated over two scrapes of the three servers taken around a real backlog's
growth: each alert fires once on the true backlog, and ``KeelBacklogGrowing`` stays quiet
on a backlog that only three times its size would make fire (as it does fire on the same
scrapes served by every server).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from tasks.jobs import BulkJob, JobOptions, Owner, add, add_bulk
from tasks.jobs.intake import pauses
from tasks.jobs.observe import metrics
from tasks.jobs.observe.queue_counts import counts
from tasks.jobs.upkeep import bulk_actions
from tasks.jobs.upkeep.bulk_actions import BulkFilter
from tasks.platform import deadletters
from tasks.platform.broker import redis_client
from tasks.platform.db import transaction
from tests.support.client import bearer, metrics_headers, unique
from tests.support.stack import PROJECT_ROOT, WebProcess, wait_for
from web import http_metrics, metrics_lease
from web.http_metrics import FLUSH_S

pytestmark = pytest.mark.stack  # starts web servers of its own

ALERTS = PROJECT_ROOT / "ops" / "prometheus" / "keel-alerts.yml"
DASHBOARD = PROJECT_ROOT / "ops" / "grafana" / "keel-jobs.json"
INSTANCES = ("web-1", "web-2", "web-3")
DAY_MS = 86_400_000

Sample = tuple[str, tuple[tuple[str, str], ...], float]
Scrapes = dict[str, list[Sample]]

# The backlog: FIRST jobs, under KeelBacklogGrowing's 1,000 though three times them are over
# it, then MORE, well over it; it grows from one scrape to the other over GROWTH_MIN minutes.
FIRST, MORE = 400, 800
GROWTH_MIN, TOTAL_MIN = 30, 60
QUIET_AT, FIRING_AT = 16, 43  # minutes: grown for over 15 minutes; then over 1,000 as long
# Ages, which grow a minute each minute while nothing takes the job.
CLOCKS = frozenset({"keel_oldest_waiting_seconds"})
BACKLOG_ALERTS = (
    "KeelBacklogGrowing",
    "KeelBacklogStale",
    "KeelDelayedJobsNotPromoted",
    "KeelDeadLettersGrowing",
)


@pytest.fixture(scope="module")
def servers(stack):
    redis_client().delete(metrics_lease.KEY)  # no holder left by an earlier run
    started = [WebProcess(stack.home, extra_env={"KEEL_METRICS_SCRAPE": "each"}) for _ in INSTANCES]
    try:
        for server in started:
            server.start()
        yield started
    finally:
        for server in started:
            server.stop()
        redis_client().delete(metrics_lease.KEY)


def scrape(server: WebProcess) -> list[Sample]:
    answer = requests.get(f"{server.url}/metrics", headers=metrics_headers(), timeout=10)
    answer.raise_for_status()
    return [
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    ]


def value(samples: list[Sample], name: str) -> float:
    [found] = [v for n, labels, v in samples if n == name and not labels]
    return found


def series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{key}={json.dumps(val)}" for key, val in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def input_series(scrapes: dict[str, list[Sample] | None]) -> list[dict]:
    """Each scrape's samples as constant series of its instance, and ``up`` for each target
    (0 where the scrape failed), over ten minutes."""
    found = []
    for instance, samples in scrapes.items():
        target = {"job": "keel", "instance": instance}
        up = 0 if samples is None else 1
        found.append({"series": series("up", target), "values": f"{up}x10"})
        for name, labels, number in samples or []:
            found.append(
                {"series": series(name, {**dict(labels), **target}), "values": f"{number!r}x10"}
            )
    return found


def dashboard_queries() -> dict[str, str]:
    """The dashboard's gauge panels (counters' rates need two scrapes apart), for every
    queue."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        f"{panel['title']}/{target['refId']}": target["expr"].replace("$queue", ".*")
        for panel in dashboard["panels"]
        for target in panel["targets"]
        if "rate(" not in target["expr"]
    }


def expected(expr: str, samples: list[Sample]) -> list[dict]:
    """What one server's samples give for ``agg by (label) (metric{...})``: the true values."""
    shape = re.fullmatch(r"(sum|max|min)(?: by \((\w+)\))? ?\((keel_\w+)(\{[^}]*\})?\)", expr)
    assert shape, f"a panel of another shape: {expr}"
    how, by, name, selector = shape.groups()
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', selector or ""))  # (=~".*" matches all)
    groups: dict[str, list[float]] = defaultdict(list)
    for sample_name, labels, number in samples:
        found = dict(labels)
        if sample_name == name and all(found.get(k) == v for k, v in wanted.items()):
            key = f"{{{by}={json.dumps(found[by])}}}" if by else "{}"
            groups[key].append(number)
    pick = {"sum": sum, "max": max, "min": min}[how]
    return [{"labels": key, "value": pick(values)} for key, values in sorted(groups.items())]


def promtool(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: Debian's prometheus package has it (.ci/run installs it)"
    spec = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "keel-test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run(
        [tool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )


def test_one_server_serves_the_system_wide_series_and_sums_count_each_job_once(servers, tmp_path):
    # Given five jobs delayed by a day (a backlog nothing runs meanwhile)
    for n in range(5):
        add("test.echo", {"n": n}, queue="default", opts=JobOptions(delay=DAY_MS))
    delayed = counts("default")["delayed"]
    # When Prometheus scrapes each of the three servers
    scrapes = {
        instance: scrape(server) for instance, server in zip(INSTANCES, servers, strict=True)
    }
    assert counts("default")["delayed"] == delayed  # (no job came due meanwhile)
    # Then exactly one of them served the system-wide series, and every one says which
    serving = [i for i, samples in scrapes.items() if value(samples, "keel_metrics_system_wide")]
    assert len(serving) == 1, serving
    [elected] = [scrapes[i] for i in serving]
    for instance, samples in scrapes.items():
        names = {name for name, _labels, _v in samples}
        assert ("keel_jobs" in names) is (instance in serving), (instance, sorted(names))
    # and a later scrape finds the same server serving them (its lease renewed)
    again = [value(scrape(server), "keel_metrics_system_wide") for server in servers]
    assert again == [float(i in serving) for i in INSTANCES]
    # and promtool, over the three scrapes, gives each dashboard query the true values
    truth = [{"labels": '{queue="default"}', "value": delayed}]
    queries = dashboard_queries()
    exprs = [
        {"expr": expr, "eval_time": "5m", "exp_samples": expected(expr, elected)}
        for expr in queries.values()
    ]
    exprs.append(
        {
            "expr": 'sum by (queue) (keel_jobs{state="delayed",queue="default"})',
            "eval_time": "5m",
            "exp_samples": truth,  # Postgres's own count: not three times it
        }
    )
    exprs.append({"expr": "sum(keel_metrics_system_wide)", "eval_time": "5m",
                  "exp_samples": [{"labels": "{}", "value": 1}]})  # fmt: skip
    quiet = ["KeelScrapeTargetDown", "KeelMetricsUnserved", "KeelMetricsCountedTwice"]
    test = {
        "interval": "1m",
        "input_series": input_series(scrapes),
        "promql_expr_test": exprs,
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": name, "exp_alerts": []} for name in quiet
        ],
    }
    checked = promtool(tmp_path, [test])
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    assert len(queries) >= 8  # the gauge panels, each evaluated


# -- the backlog alerts and the rate() panels, over a backlog that grows ----------------------


@dataclass(frozen=True)
class Backlog:
    tenant: str
    added: list[str] = field(default_factory=list)  # its jobs' ids, as the test adds them


@pytest.fixture
def held_tenant(stack) -> Iterator[Backlog]:
    """A tenant whose jobs on ``default`` its own pause holds: they wait, and no worker of
    the session runs them (a worker that takes one's message holds it). Its jobs are
    cancelled afterwards, the pause lifted, and the messages of its jobs that no worker
    took are dropped from Redis, so that later tests' workers do not find them."""
    held = Backlog(unique("backlog"))
    pauses.pause("default", held.tenant, by="test")
    try:
        yield held
    finally:
        chosen = BulkFilter(states=(), queue="default", tenant_id=held.tenant)
        asked = bulk_actions.Asked("cancel", chosen, "test", "the backlog test is over")
        row = bulk_actions.start(asked, system=True)
        while bulk_actions.work(row.id, batches=20):
            pass
        pauses.resume("default", held.tenant, by="test")
        drop_messages("default", set(held.added))


def drop_messages(queue: str, ids: set[str]) -> int:
    """Remove the messages of jobs ``ids`` from ``queue``'s lists in Redis (and its
    priority lists); how many there were."""
    client, dropped = redis_client(), 0
    for key in [queue.encode(), *client.scan_iter(match=f"{queue}\x06\x16*")]:
        for raw in client.lrange(key, 0, -1):
            if json.loads(raw).get("headers", {}).get("id") in ids:
                dropped += client.lrem(key, 1, raw)
    return dropped


@contextmanager
def promoter_holding(job_ids: list[str]) -> Iterator[None]:
    """The jobs' rows locked as a promoter locks those it publishes, as long as one whose
    publish hangs on the broker holds them: the other promoters skip them (``SKIP LOCKED``),
    so they stay delayed once due. The scrapes read them without waiting on the lock."""
    with transaction() as session:
        session.execute(
            text("SELECT id FROM jobs WHERE id = ANY(:ids) FOR UPDATE"), {"ids": job_ids}
        )
        yield


def due(job_ids: list[str]) -> bool:
    with transaction() as session:
        found = session.execute(
            text(
                "SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND state = 'delayed' "
                "AND run_at <= clock_timestamp()"
            ),
            {"ids": job_ids},
        ).scalar_one()
    return found == len(job_ids)


def scrape_all(servers: list[WebProcess]) -> Scrapes:
    return {instance: scrape(server) for instance, server in zip(INSTANCES, servers, strict=True)}


def elected(scrapes: Scrapes) -> str:
    [serving] = [i for i, samples in scrapes.items() if value(samples, "keel_metrics_system_wide")]
    return serving


def at_minute(name: str, first: float | None, last: float | None, minute: int) -> float | None:
    """A series' value ``minute`` minutes after the first scrape (None: no sample): on the
    straight line from the first scrape's value to the second's, reached at ``GROWTH_MIN``
    and held after; an age (``CLOCKS``) a minute older each minute from its first value."""
    if name in CLOCKS:
        start, base = (0, first) if first is not None else (GROWTH_MIN, last)
        ends = GROWTH_MIN if last is None else TOTAL_MIN + 1
        return None if base is None or not start <= minute < ends else base + 60 * (minute - start)
    if minute >= GROWTH_MIN:
        return last
    if first is None or last is None:
        return first  # one only the second scrape has appears with it; one it lacks ends
    return first + (last - first) * minute / GROWTH_MIN


def grown_series(before: Scrapes, after: Scrapes) -> list[dict]:
    """Every server's series, as Prometheus stores them while the backlog grows from the
    first scrape's to the second's over ``GROWTH_MIN`` minutes (``at_minute``), one sample
    a minute for ``TOTAL_MIN`` minutes; counters stay monotonic on the line."""
    found = []
    for instance in INSTANCES:
        target = {"job": "keel", "instance": instance}
        found.append({"series": series("up", target), "values": f"1x{TOTAL_MIN}"})
        first = {(name, labels): number for name, labels, number in before[instance]}
        last = {(name, labels): number for name, labels, number in after[instance]}
        for name, labels in sorted(first.keys() | last.keys()):
            key = (name, labels)
            values = [
                at_minute(name, first.get(key), last.get(key), m) for m in range(TOTAL_MIN + 1)
            ]
            found.append(
                {
                    "series": series(name, {**dict(labels), **target}),
                    "values": " ".join("_" if v is None else repr(v) for v in values),
                }
            )
    return found


def served_by_every_server(scrapes: Scrapes, serving: str) -> Scrapes:
    """The scrapes as they were before one server was elected: each server serving the
    system-wide series (as ``KEEL_METRICS_SCRAPE=one`` does behind three targets)."""
    return {instance: scrapes[serving] for instance in scrapes}


def rate_panels() -> dict[str, str]:
    """The dashboard's ``rate()`` panels, for every queue."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        f"{panel['title']}/{target['refId']}": target["expr"].replace("$queue", ".*")
        for panel in dashboard["panels"]
        for target in panel["targets"]
        if "rate(" in target["expr"]
    }


def of_instance(expr: str, instance: str) -> str:
    """``expr`` over one target's series only."""

    def narrowed(found: re.Match[str]) -> str:
        inner = found.group(2)
        return f'{found.group(1)}{{instance="{instance}"{"," + inner if inner else ""}}}'

    return re.sub(r"\b(keel_\w+)(?:\{([^}]*)\})?", narrowed, expr)


def firing(
    at: int, expected: dict[tuple[str, str], int], queues: str, alerts: tuple[str, ...]
) -> dict:
    """``alerts`` firing at minute ``at`` on ``queues``: how many of each, by queue."""
    names = "|".join(alerts)
    return {
        "expr": f'count by (alertname, queue) (ALERTS{{alertstate="firing",'
        f'alertname=~"{names}",queue=~"{queues}"}})',
        "eval_time": f"{at}m",
        "exp_samples": [
            {"labels": f'{{alertname="{name}",queue="{queue}"}}', "value": n}
            for (name, queue), n in sorted(expected.items())
        ],
    }


def test_the_backlog_alerts_fire_once_on_a_true_backlog_not_on_three_times_it(
    servers, held_tenant, tmp_path
):
    tenant, queue = held_tenant.tenant, "default"
    owner = Owner(tenant, "alice")
    letters_queue = unique("letters")

    def added(jobs: list[BulkJob]) -> list[str]:
        ids = [job.job_id for job in add_bulk(jobs, owner=owner)]
        held_tenant.added.extend(ids)
        return ids

    def list_jobs_on_each_server() -> None:
        served = requests_counted()
        for server in servers:
            headers = bearer(tenant)
            answer = requests.get(f"{server.url}/api/v1/jobs", headers=headers, timeout=10)
            assert answer.status_code == 200, answer.text
        # (each server adds its requests to the counts every http_metrics.FLUSH_S)
        wait_for(lambda: requests_counted() >= served + len(servers), timeout=3 * FLUSH_S)

    def runs_ended_elsewhere() -> None:
        # What a worker's pool process counts as its runs end (no worker runs this module's
        # jobs): ends, waits before start and run times, on the backlog's queue
        for n in range(5):
            metrics.count_event(queue, "completed", job_name="test.echo")
            metrics.observe(queue, "wait", 0.01 * (n + 1), job_name="test.echo")
            metrics.observe(queue, "duration", 0.02 * (n + 1), job_name="test.echo")
        metrics.count_event(queue, "failed", job_name="test.echo")
        assert metrics.flush()

    # Given requests and runs the servers have counted already (so that their series are in
    # the first scrape, and grow by the second)
    list_jobs_on_each_server()
    runs_ended_elsewhere()
    # and a backlog of FIRST jobs on default that nothing runs (their tenant's pause holds
    # them), scraped from the three servers
    added([BulkJob("test.echo", {"n": n}, queue) for n in range(FIRST)])
    before = scrape_all(servers)
    # When MORE jobs join it, API requests are served, three unreadable messages are set
    # aside on a queue of their own, and two delayed jobs fall due while a promoter holds
    # them, then the servers are scraped again
    added([BulkJob("test.echo", {"n": n}, queue) for n in range(MORE)])
    list_jobs_on_each_server()
    runs_ended_elsewhere()
    pipe = redis_client().pipeline()
    for n in range(3):
        deadletters.add(
            pipe, deadletters.DeadLetter.of(letters_queue, letters_queue, b"junk %d" % n, "test")
        )
    pipe.execute()
    delayed = [BulkJob("test.echo", {}, queue, JobOptions(delay=2000)) for _ in range(2)]
    late = added(delayed)
    try:
        with promoter_holding(late):
            wait_for(lambda: due(late), timeout=15)
            after = scrape_all(servers)
    finally:
        deadletters.drop(redis_client(), letters_queue)
    serving = elected(before)
    assert elected(after) == serving, "the lease was renewed by the scrapes"

    # Then the true backlog (what the elected server serves) is under 1,000 at QUIET_AT,
    # grown for over 15 minutes, three times it over 1,000; over 1,000 by FIRING_AT - 15
    def waiting(scrapes: Scrapes) -> float:
        return value_of(scrapes[serving], "keel_jobs", queue=queue, state="waiting")

    def backlog(minute: int) -> float:
        found = at_minute("keel_jobs", waiting(before), waiting(after), minute)
        assert found is not None
        return found

    assert 3 * backlog(0) > 1000 > backlog(QUIET_AT), (waiting(before), waiting(after))
    assert backlog(FIRING_AT - 16) > 1000, (waiting(before), waiting(after))
    assert value_of(after[serving], "keel_jobs_delayed_due", queue=queue) >= 2
    assert value_of(after[serving], "keel_dead_letters", queue=letters_queue) == 3
    queues = f"{queue}|{letters_queue}"
    # and promtool: no backlog alert has fired at QUIET_AT (KeelBacklogStale and
    # KeelDelayedJobsNotPromoted may have, after their own `for`), the sum is the true one
    early = firing(QUIET_AT, {}, queues, ("KeelBacklogGrowing",))
    truth = {
        "expr": f'sum by (queue) (keel_jobs{{state="waiting",queue="{queue}"}})',
        "eval_time": f"{QUIET_AT}m",
        "exp_samples": [{"labels": f'{{queue="{queue}"}}', "value": backlog(QUIET_AT)}],
    }
    # and each of the four fires once, on its queue, at FIRING_AT
    fired = {
        ("KeelBacklogGrowing", queue): 1,
        ("KeelBacklogStale", queue): 1,
        ("KeelDelayedJobsNotPromoted", queue): 1,
        ("KeelDeadLettersGrowing", letters_queue): 1,
    }
    # and each rate() panel over the three targets is what the elected server's series give
    # (not three times it), with data to compare in every one: the requests served and the
    # runs counted meanwhile
    panels = rate_panels()
    rates = []
    for expr in panels.values():
        own = of_instance(expr, serving)
        rates.append({"expr": f"({expr}) > ({own}) or ({expr}) < ({own})", "eval_time": "20m",
                      "exp_samples": []})  # fmt: skip
        rates.append({"expr": f"(count({expr}) or vector(0)) - (count({own}) or vector(0))",
                      "eval_time": "20m",
                      "exp_samples": [{"labels": "{}", "value": 0}]})  # fmt: skip
        rates.append({"expr": f"count(({expr}) > 0) > bool 0", "eval_time": "20m",
                      "exp_samples": [{"labels": "{}", "value": 1}]})  # fmt: skip
    true_backlog = {
        "interval": "1m",
        "input_series": grown_series(before, after),
        "promql_expr_test": [
            early,
            truth,
            firing(FIRING_AT, fired, queues, BACKLOG_ALERTS),
            *rates,
        ],
    }
    # while the same scrapes, served by every server, fire KeelBacklogGrowing at QUIET_AT
    tripled = {
        "interval": "1m",
        "input_series": grown_series(
            served_by_every_server(before, serving), served_by_every_server(after, serving)
        ),
        "promql_expr_test": [
            firing(QUIET_AT, {("KeelBacklogGrowing", queue): 1}, queue, BACKLOG_ALERTS[:1])
        ],
    }
    checked = promtool(tmp_path, [true_backlog, tripled])
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    assert len(panels) >= 6  # the rate() panels, each evaluated


def requests_counted() -> float:
    """The API requests every web process has counted so far (what /metrics serves)."""
    return sum(parts.get("count", 0.0) for parts in http_metrics.snapshot().values())


def value_of(samples: list[Sample], name: str, **labels: str) -> float:
    [found] = [v for n, found, v in samples if n == name and labels.items() <= dict(found).items()]
    return found


# -- last: it stops a server of the module's three ----------------------------------------


def test_a_server_that_stops_answering_fires_its_alert(servers, tmp_path):
    scrapes: dict[str, list[Sample] | None] = {
        instance: scrape(server) for instance, server in zip(INSTANCES, servers, strict=True)
    }
    # Given the third server stopped (if it held the lease, another takes it within 60 s)
    servers[2].stop()
    with pytest.raises(requests.ConnectionError):
        scrape(servers[2])
    scrapes["web-3"] = None  # Prometheus's up == 0 for it
    # Then promtool fires KeelScrapeTargetDown for it after 2 minutes, and only for it
    down = {
        "eval_time": "5m",
        "alertname": "KeelScrapeTargetDown",
        "exp_alerts": [
            {
                "exp_labels": {"job": "keel", "instance": "web-3", "severity": "critical"},
                "exp_annotations": annotations("KeelScrapeTargetDown", instance="web-3"),
            }
        ],
    }
    test = {"interval": "1m", "input_series": input_series(scrapes), "alert_rule_test": [down]}
    checked = promtool(tmp_path, [test])
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]


def annotations(alert: str, **labels: str) -> dict[str, str]:
    """The alert's annotations, its ``{{ $labels.x }}`` filled in as Prometheus does."""
    rules = yaml.safe_load(ALERTS.read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
    return {
        key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        for key, text in rule["annotations"].items()
    }

"""Three web servers scraped one by one, as Prometheus scrapes Kubernetes pods
(``KEEL_METRICS_SCRAPE=each``, ``web.metrics_lease``).

Each server is a real gunicorn. Their three scrapes become the input series of a
``promtool test rules`` file, one ``instance`` each, and promtool evaluates the shipped
dashboard's queries and alert rules over them: the sums give the true backlog (what one
server serves, and Postgres's own count), not three times it, and a server that stops
answering fires ``KeelScrapeTargetDown``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tasks.jobs import JobOptions, add
from tasks.jobs.observe.queue_counts import counts
from tasks.platform.broker import redis_client
from tests.support.client import metrics_headers
from tests.support.stack import PROJECT_ROOT, WebProcess
from web import metrics_lease

pytestmark = pytest.mark.stack  # starts web servers of its own

ALERTS = PROJECT_ROOT / "ops" / "prometheus" / "keel-alerts.yml"
DASHBOARD = PROJECT_ROOT / "ops" / "grafana" / "keel-jobs.json"
INSTANCES = ("web-1", "web-2", "web-3")
DAY_MS = 86_400_000

Sample = tuple[str, tuple[tuple[str, str], ...], float]


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

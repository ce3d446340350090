"""The alert rules and the Grafana dashboard in ops/ use only metrics Keel exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.support.client import metrics_headers
from web.system import EXPORTED

OPS = Path(__file__).resolve().parents[2] / "ops"
SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """The keel_* metric names an expression reads (a histogram's series by its family)."""
    names = set(re.findall(r"\bkeel_[a-z_]+\b", expr))
    return {next((n[: -len(s)] for s in SUFFIXES if n.endswith(s)), n) for n in names}


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((OPS / "prometheus" / "keel-alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def rule_expressions() -> dict[str, str]:
    return {rule["alert"]: rule["expr"] for rule in alert_rules()}


def dashboard_expressions() -> dict[str, str]:
    dashboard = json.loads((OPS / "grafana" / "keel-jobs.json").read_text())
    found = {
        f"{panel['title']}/{target['refId']}": target["expr"]
        for panel in dashboard["panels"]
        for target in panel["targets"]
    }
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found[f"${variable['name']}"] = variable["query"]
    return found


def test_every_alert_and_panel_reads_an_exported_metric():
    expressions = {**rule_expressions(), **dashboard_expressions()}
    assert len(expressions) >= 15
    for where, expr in expressions.items():
        names = metric_names(expr)
        # (the scrape's own health is Prometheus's series of Keel's scrape job)
        assert names or 'up{job="keel"}' in expr, f"{where} reads no Keel metric: {expr}"
        assert names <= EXPORTED, f"{where} reads {sorted(names - EXPORTED)}, not exported"


def test_the_alerts_named_by_the_docs_are_there():
    assert {
        "KeelNoWorkers",
        "KeelBeatSilent",
        "KeelBacklogStale",
        "KeelJobsWaitLong",
        "KeelJobFailureRate",
        "KeelDeadLettersGrowing",
        "KeelDelayedJobsNotPromoted",
    } <= set(rule_expressions())


def headings(page: Path) -> set[str]:
    """The anchors of a docs page's headings, as mkdocs makes them (these are plain words)."""
    found = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") for title in found}


def test_every_alert_has_a_runbook_section_in_the_docs():
    runbooks = OPS.parent / "docs" / "operations" / "runbooks.md"
    sections = headings(runbooks)
    for rule in alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page.endswith("/operations/runbooks/"), (rule["alert"], url)
        assert anchor == rule["alert"].lower() and anchor in sections, (rule["alert"], url)


def test_the_metrics_keel_serves_are_the_ones_it_declares(client):
    """EXPORTED cannot drift: every family /metrics serves is declared (and the alerts'
    names with it)."""
    served = client.get("/metrics", headers=metrics_headers()).get_data(as_text=True)
    families = set(re.findall(r"^# TYPE (keel_[a-z_]+) (\w+)", served, re.MULTILINE))
    # (a counter's TYPE line names it with _total, as its samples do)
    named = {name for name, _kind in families}
    assert named <= EXPORTED, sorted(named - EXPORTED)
    assert {"keel_jobs", "keel_workers_alive", "keel_scrape_errors_total"} <= named

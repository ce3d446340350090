"""Write components/monitoring/prometheusrule.yaml from ops/prometheus/keel-alerts.yml.

The PrometheusRule's spec is the rules file, unchanged (its groups), so the alerts
Prometheus Operator loads are the ones the repository ships and tests.
tests/unit/test_kubernetes_manifests.py fails when the two differ; then run, from the
repository's root folder:

    .venv/bin/python deploy/kubernetes/sync_alerts.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus" / "keel-alerts.yml"
TARGET = Path(__file__).resolve().parent / "components" / "monitoring" / "prometheusrule.yaml"
HEADER = (
    "# Generated from ops/prometheus/keel-alerts.yml by deploy/kubernetes/sync_alerts.py:\n"
    "# do not edit; change that file, then run the script again.\n"
)


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule holding ``rules`` (a Prometheus rules file's content)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "keel",
            "labels": {"app.kubernetes.io/name": "keel", "app.kubernetes.io/component": "alerts"},
        },
        "spec": {"groups": rules["groups"]},
    }


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render() -> str:
    rule = prometheus_rule(yaml.safe_load(RULES.read_text()))
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=100)


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(ROOT)}")

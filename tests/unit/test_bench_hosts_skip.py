"""P7 needs root and ``ip netns``; without them it is skipped with its reason, not failed."""

from __future__ import annotations

from bench import fig_hosts
from bench.plan import QUICK, Run
from bench.report import markdown


def test_p7_without_network_namespaces_is_skipped_with_its_reason(monkeypatch):
    # Given a machine where network namespaces cannot be built
    reason = "network namespaces need root (ip netns add)"
    monkeypatch.setattr("tests.support.netns.unavailable_reason", lambda: reason)
    # When P7 runs
    figure = fig_hosts.p7_hosts(Run(env=None, sizes=QUICK, repeat=1, quick=True))
    # Then it is skipped, not an error, and the table says why
    assert figure.skipped == reason and figure.error is None and not figure.series
    meta = {
        "timestamp": "t",
        "command": "c",
        "repeat": 1,
        "servers": {"postgres": "-", "redis": "-"},
        "machine": {"cpus": 2, "python": "3"},
    }
    assert f"| P7 {figure.title} | skipped: {reason} |" in markdown(meta, [figure])


def test_bottleneck_names_the_machine_when_its_cores_are_busy():
    cores = {"postgres": 0.2, "redis": 0.05, "w1": 0.6, "producer": 0.3}
    assert fig_hosts.bottleneck(cores, 0.97).startswith("the machine's CPU (97% of")
    assert fig_hosts.bottleneck({**cores, "producer": 0.95}, 0.6).startswith("producer")
    assert fig_hosts.bottleneck(cores, 0.5).startswith("no part saturated; w1")

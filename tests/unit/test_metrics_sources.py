"""A scrape whose source fails leaves out that source's series and counts an error
(``web.system.Source``); the other sources still answer."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from web import system


def test_a_failing_source_is_left_out_and_counted_while_the_others_answer():
    def working():
        family = GaugeMetricFamily("keel_test_up", "a source that answers")
        family.add_metric([], 1)
        yield family

    def failing():
        yield GaugeMetricFamily("keel_test_half", "never reached whole")
        raise ConnectionError("Postgres is down")

    registry = CollectorRegistry()
    registry.register(system.Source("test-working", working))
    registry.register(system.Source("test-failing", failing))
    before = system.SCRAPE_ERRORS.labels("test-failing")._value.get()
    exposed = generate_latest(registry).decode()
    assert "keel_test_up 1.0" in exposed
    assert "keel_test_half" not in exposed  # not even the families read before the error
    assert system.SCRAPE_ERRORS.labels("test-failing")._value.get() == before + 1
    assert system.SCRAPE_ERRORS.labels("test-working")._value.get() == 0
    up = {
        sample.labels["source"]: sample.value
        for family in system.SourcesUp().collect()
        for sample in family.samples
    }
    assert (up["test-working"], up["test-failing"]) == (1, 0)
    # The counter is one of /metrics' own series
    assert system.OWN._names_to_collectors["keel_scrape_errors_total"] is system.SCRAPE_ERRORS

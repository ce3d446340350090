"""The queues page shows each queue's limits in force and where they come from: set live
(when; not who nor why: the system's own) or ``KEEL_QUEUE_LIMITS``. It changes nothing."""

from __future__ import annotations

import pytest

from tasks.jobs.run import live_limits
from tests.support.client import unique
from tests.support.ui import PAGE, signed_in

pytestmark = pytest.mark.usefixtures("stack")
OPERATOR = ("operator",)
REASON = "secret partner incident for tenant globex"


def reports_card(operator) -> str:
    page = operator.get("/ui/queues", headers=PAGE)
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    return text[text.index('data-queue="reports"') :].split("</section>")[0]


def test_a_limit_set_live_shows_with_its_time_and_no_system_operators_name(app):
    operator = signed_in(app, unique("limits"), "olga", OPERATOR)
    assert 'data-limits-source="none"' in reports_card(operator)
    live_limits.set_limits(
        "reports", {"concurrency": 1, "rate": {"max": 5, "duration_ms": 1000}}, "cli:root", REASON
    )
    try:
        card = reports_card(operator)
        assert 'data-limits-source="live"' in card
        assert "1 at once · 5 starts per 1000 ms" in card and "set live" in card
        assert "<time datetime=" in card and "default: none" in card
        assert "cli:root" not in card and REASON not in card
        assert "/limits" not in card  # read-only: no form changes a limit
    finally:
        live_limits.clear_limits("reports", "cli:root", REASON)
    assert 'data-limits-source="none"' in reports_card(operator)

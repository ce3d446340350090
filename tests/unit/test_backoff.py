"""BullMQ's backoff rule, as pure arithmetic."""

from __future__ import annotations

import random

import pytest

from tasks.jobs.model.options import Backoff, backoff_delay_ms, backoff_max_ms

REPORTS = Backoff(type="exponential", delay=1000, jitter=0.5)


@pytest.mark.parametrize(("failures", "maximum"), [(1, 1000), (2, 2000), (3, 4000), (4, 8000)])
def test_exponential_maximum_doubles_per_failure(failures, maximum):
    assert backoff_max_ms(REPORTS, failures) == maximum


@pytest.mark.parametrize("failures", [1, 2, 3])
def test_jitter_picks_within_the_upper_half(failures):
    rng = random.Random(7)
    maximum = backoff_max_ms(REPORTS, failures)
    picks = [backoff_delay_ms(REPORTS, failures, rng) for _ in range(2000)]
    assert min(picks) >= maximum * 0.5
    assert max(picks) <= maximum
    # uniform, not clustered at one end: both quarters of the range are hit
    assert any(p < maximum * 0.6 for p in picks) and any(p > maximum * 0.9 for p in picks)


def test_fixed_and_no_jitter_are_exact():
    assert backoff_delay_ms(Backoff(type="fixed", delay=250), 3) == 250
    assert backoff_delay_ms(Backoff(type="exponential", delay=100), 3) == 400
    assert backoff_delay_ms(None, 1) == 0

"""Pure rules behind the tenants' caps on running jobs (``tasks.jobs.run.tenant_caps``):
what each cap is, given the live workers' slots and ``KEEL_TENANT_QUOTAS``."""

from __future__ import annotations

import pytest

from tasks.jobs.run import capacity
from tasks.jobs.run.capacity import Slots
from tasks.jobs.run.tenant_caps import Caps, names, share_key
from tasks.jobs.upkeep import liveness
from tasks.platform.setting_types import parse_tenant_quotas as parse

DEFAULTS = parse("")
RESERVE_ONE = parse('{"systemReserve": 1}')


@pytest.mark.parametrize(
    ("slots", "cap"), [(0, None), (1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (9, 5), (10, 5)]
)
def test_the_default_cap_is_half_the_slots_rounded_up_and_nothing_else_is_capped(slots, cap):
    # (nothing reserved by default: the tenants' share is every slot, so it is not taken;
    # no cap per queue unless one is set)
    caps = Caps.of(DEFAULTS, Slots(slots, {"q": slots}), "q")
    assert caps.tenant == cap
    assert (caps.per_queue, caps.tenants, caps.tenants_on_queue) == (None, None, None)


@pytest.mark.parametrize(
    ("slots", "cap"), [(0, None), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (9, 4), (10, 5)]
)
def test_with_a_reserve_the_cap_is_half_the_tenants_share_rounded_up(slots, cap):
    # (the share: the live slots less the system's one, at least one; none without workers)
    caps = Caps.of(RESERVE_ONE, Slots(slots, {"q": slots}), "q")
    assert caps.tenant == cap


def test_a_cap_per_queue_holds_below_the_overall_one_when_set():
    # Given a reports worker of 3 and a default worker of 3 (the audit's figures)
    slots = Slots(6, {"reports": 3, "default": 3})
    # Then by default a tenant runs at most 3 jobs in all (half of 6), on any queue
    assert (
        Caps.of(DEFAULTS, slots, "reports").tenant,
        Caps.of(DEFAULTS, slots, "reports").per_queue,
    ) == (3, None)
    # and with a cap per queue set, at most that many on reports
    capped = Caps.of(parse('{"maxRunningPerQueue": 1}'), slots, "reports")
    assert (capped.tenant, capped.per_queue) == (3, 1)
    # And with one slot reserved, 3 in all (half of 5), and every tenant's together at most
    # 2 on reports (its worker's 3 less the reserve)
    reserving = Caps.of(RESERVE_ONE, slots, "reports")
    assert (reserving.tenant, reserving.tenants_on_queue, reserving.tenants) == (3, 2, 5)


def test_the_heartbeats_keys_are_the_ones_capacity_reads():
    assert liveness.key("worker") == capacity.ALIVE_KEY
    assert capacity.FRESH_S == liveness.FRESH_S


@pytest.mark.parametrize(
    ("slots", "on_queue", "reserve", "tenants", "tenants_on_queue"),
    [
        (3, 3, 1, 2, 2),  # one worker of 3: two busy tenants leave one slot free
        (6, 3, 1, 5, 2),
        (1, 1, 1, 1, 1),  # one slot: nothing can be reserved without stopping every tenant
        (6, 3, 0, None, None),  # "systemReserve": 0 (the default): every slot, none taken
        (6, 3, 4, 2, 1),
        (0, 0, 1, None, None),  # no worker known: no cap
    ],
)
def test_the_tenants_together_leave_the_system_its_reserve(
    slots, on_queue, reserve, tenants, tenants_on_queue
):
    quotas = parse(f'{{"systemReserve": {reserve}}}')
    caps = Caps.of(quotas, Slots(slots, {"q": on_queue}), "q")
    assert (caps.tenants, caps.tenants_on_queue) == (tenants, tenants_on_queue)


def test_configured_caps_replace_the_shares_of_the_slots():
    quotas = parse('{"maxRunning": 7, "maxRunningPerQueue": 3}')
    caps = Caps.of(quotas, Slots(100, {"q": 40}), "q")
    assert (caps.tenant, caps.per_queue) == (7, 3)
    assert Caps.of(quotas, Slots(), "q").tenant == 7  # set: no worker needs to be known


@pytest.mark.parametrize(
    "raw", ['{"maxRunningPerQueue": 0}', '{"systemReserve": -1}', '{"maxRunningPerQueue": "2"}']
)
def test_a_bad_cap_is_refused_naming_the_setting(raw):
    with pytest.raises(ValueError, match="KEEL_TENANT_QUOTAS"):
        parse(raw)


def test_no_two_tenants_or_queues_share_a_line():
    keys = {
        names("a", "b.c").base,
        names("a.b", "c").base,
        names("a").base,
        names("a:q1.b").base,
        share_key("a"),
        share_key("a:q1.b"),
    }
    assert len(keys) == 6

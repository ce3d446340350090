"""Prefetch slots held by messages no task has are given back, and consuming goes on.

kombu's Redis consumer sends BRPOP only while a prefetch slot is free. Here
every slot of a real worker (in this process) is taken by a delivery that no
request carries — what a lost ack used to leave behind — and a job added
after that must still run: ``tasks.jobs.run.slots`` gives the orphaned slots back.
"""

from __future__ import annotations

from unittest.mock import patch

import pytest
from kombu.transport import virtual

from tasks.jobs.intake.enqueue import add
from tasks.jobs.run import slots
from tests.support.inline import join

pytestmark = pytest.mark.usefixtures("inline_worker")


class Orphan:
    """A delivery kombu holds a slot for; nothing of it is ever read."""

    delivery_info: dict = {}


def held(qos) -> int:
    return len(qos._delivered) - len(qos._dirty)


def prefetch_watch(worker) -> slots.SlotWatch:
    """The running worker's ``PrefetchWatch`` (its consumer's bootstep) and its ``SlotWatch``."""
    [step] = [s for s in worker.consumer.steps if isinstance(s, slots.PrefetchWatch)]
    assert step.tref is not None, "the watch does not run"
    return step.watch


def test_slots_held_by_no_task_are_given_back_and_the_worker_consumes_again(inline_worker):
    qos = inline_worker.consumer.task_consumer.channel.qos
    assert qos.prefetch_count and hasattr(qos, "_delivered")
    assert prefetch_watch(inline_worker).orphan_s == 30  # KEEL_PREFETCH_ORPHAN_S's default
    # Given every prefetch slot held by a delivery no request of the worker carries
    # (given back after 1 s here rather than 30)
    with patch.object(prefetch_watch(inline_worker), "orphan_s", 1.0):
        for n in range(qos.prefetch_count):
            virtual.QoS.append(qos, Orphan(), f"orphan-{n}")
        assert not qos.can_consume()
        # When a job is added, Then it runs: the orphaned slots were given back
        added = add("test.echo", {"said": "still consuming"}, queue="default")
        done = join([added.job_id], timeout=45)
    assert done[added.job_id]["state"] == "completed"
    assert not any(str(tag).startswith("orphan-") for tag in set(qos._delivered) - qos._dirty)
    assert held(qos) < qos.prefetch_count

"""What ``add`` and ``add_bulk`` refuse from Python, before anything is recorded (real Postgres).

A job's data is a JSON object (BullMQ's ``data``; the API and the CLI answer
``validation_failed`` for anything else). From Python the same is a ``TypeError``
at the call, not a job that fails later at publish.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from tasks.jobs import BulkJob, add, add_bulk
from tasks.jobs.model.models import JobRecord
from tasks.platform.db import transaction
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")


def recorded_on(queue: str) -> int:
    with transaction() as session:
        query = select(func.count()).select_from(JobRecord).where(JobRecord.queue == queue)
        return session.execute(query).scalar_one()


@pytest.mark.parametrize("data", [[1, 2], "text", None, 3, (("a", 1),)])
def test_add_refuses_data_that_is_not_a_dict_and_records_nothing(data):
    queue = unique("input")
    with pytest.raises(TypeError, match=r"a job's data must be a dict \(a JSON object\), not "):
        add("test.echo", data, queue=queue)
    assert recorded_on(queue) == 0


def test_a_bulk_add_with_one_job_whose_data_is_not_a_dict_records_none_of_them():
    queue = unique("input")
    jobs = [BulkJob("test.echo", {"i": i}, queue) for i in range(3)]
    jobs.insert(1, BulkJob("test.echo", ["not", "a", "dict"], queue))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"job 1's data must be a dict \(a JSON object\), not list"):
        add_bulk(jobs)
    assert recorded_on(queue) == 0


def test_a_dict_subclass_is_data():
    class Payload(dict):
        pass

    queue = unique("input")
    added = add("test.echo", Payload(a=1), queue=queue)
    assert added.created and recorded_on(queue) == 1

"""The chaos tier's kill -9 and triple delivery, with RabbitMQ as the broker.

The scenarios of ``tests.chaos`` themselves, run on RabbitMQ: there a killed
worker's unacknowledged messages come back as soon as its connection drops
(no visibility timeout), and copies of a message are separate messages of a
quorum queue. The records must still let each job complete exactly once.
"""

from __future__ import annotations

from tests.chaos.test_duplicate_delivery import deliver_each_three_times
from tests.chaos.test_worker_kill import kill_during_in_flight_reports


def test_sigkill_during_200_in_flight_reports_completes_200_with_no_duplicate(spawn):
    """200/200 complete and one artifact per operation key after a worker is SIGKILLed."""
    kill_during_in_flight_reports(spawn, 200)


def test_each_report_delivered_three_times_runs_once_and_stores_one_artifact(spawn):
    """200 jobs x 3 deliveries through a quorum queue → 200 runs, 200 artifacts."""
    deliver_each_three_times(spawn, 200)

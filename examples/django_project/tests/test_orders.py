"""An order and its confirmation job, both or neither (``celery -A proj worker`` runs it)."""

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from celery.result import AsyncResult
from django.db import connection, transaction
from shop.models import Order
from shop.tasks import confirm

import keel

pytestmark = pytest.mark.django_db(transaction=True)
PROJECT = Path(__file__).resolve().parents[1]


def reference() -> str:
    return f"order-{uuid.uuid4().hex[:8]}"


def test_an_order_rolled_back_leaves_no_job_and_no_order():
    ref = reference()
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference=ref)
        with keel.in_transaction(connection):
            job = confirm.delay(ref)
        raise RuntimeError("the view failed after the add")
    assert keel.get_job(job.id) is None
    assert not Order.objects.filter(reference=ref).exists()


def test_an_order_committed_is_confirmed_by_its_job_once():
    ref = reference()
    with transaction.atomic():
        Order.objects.create(reference=ref)
        with keel.in_transaction(connection):
            job = confirm.delay(ref)
        assert keel.get_job(job.id) is None  # nobody else sees it before the commit
    assert job.get(timeout=60) == {"confirmed": 1}
    record = keel.get_job(job.id)
    assert (record.state, record.queue, record.attempts_started) == ("completed", "orders", 1)
    assert Order.objects.get(reference=ref).confirmed is True


KILLED_AFTER_COMMIT = """
import os, signal
from django.db import connection, transaction
import keel
from shop.models import Order
from shop.tasks import confirm

with transaction.atomic():
    # Registered before Keel's own callback: the process dies once the commit is done
    # and before Keel publishes anything.
    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    Order.objects.create(reference={ref!r})
    with keel.in_transaction(connection):
        print(confirm.delay({ref!r}).id, flush=True)
print("not reached", flush=True)
"""


def test_a_process_killed_between_commit_and_publish_still_confirms_once():
    ref = reference()
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", KILLED_AFTER_COMMIT.format(ref=ref)],
        cwd=PROJECT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    job_id = done.stdout.split()[-1]  # (Django may print before it)
    # The promoter publishes it once its parking (5 s) runs out
    assert AsyncResult(job_id).get(timeout=60) == {"confirmed": 1}
    assert keel.get_job(job_id).attempts_started == 1
    assert Order.objects.get(reference=ref).confirmed is True

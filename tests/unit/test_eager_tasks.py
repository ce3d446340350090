"""A project's own unit tests run its tasks in-process, with no Postgres or Redis.

``task_always_eager`` and ``task.apply()`` are Celery's eager mode: the task runs in the
caller's process, its retries are Celery's own (run at once, ``request.retries`` counting
them), and nothing is recorded. The script below runs in a process of its own whose
``KEEL_DATABASE_URL`` and ``KEEL_REDIS_URL`` name ports where nothing listens: any
attempt to record, claim or publish would fail it.
"""

from __future__ import annotations

from tests.support.stack import PROJECT_ROOT
from tests.support.user_project import run_pytest

USERS_TESTS = """
import pytest
from tasks.celery import app
from tasks.jobs import handler

runs = []


@app.task(bind=True, autoretry_for=(IOError,), retry_backoff=True, max_retries=3,
          name="mine.flaky")
def flaky(self, fail_times):
    runs.append(self.request.retries)
    if self.request.retries < fail_times:
        raise IOError(f"not yet (run {self.request.retries + 1})")
    return {"retries": self.request.retries}


@handler("mine.context", queue="default")
def context_job(job):
    job.update_progress(50)
    job.log("from the handler")
    return {"data": job.data, "attempt": job.attempts_started, "lines": job.logs}


@app.task(bind=True, name="mine.logs")
def logs(self, n):
    return [self.log(f"line {i}") for i in range(n)]


@pytest.fixture
def eager():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_delay_runs_in_process_with_celerys_retries(eager):
    runs.clear()
    result = flaky.delay(2)
    assert (result.get(), result.state) == ({"retries": 2}, "SUCCESS")
    assert runs == [0, 1, 2]


def test_retries_run_out_as_in_celery(eager):
    result = flaky.delay(9)
    assert result.state == "FAILURE"
    with pytest.raises(IOError, match="run 4"):
        result.get()


def test_apply_and_a_direct_call_need_no_setting():
    assert flaky.apply((1,)).get() == {"retries": 1}
    assert flaky(0) == {"retries": 0}
    assert context_job.apply(kwargs={"a": 1}).get() == {
        "data": {"a": 1}, "attempt": 1, "lines": ["from the handler"]
    }


def test_a_job_log_written_in_process_is_kept_in_memory(eager):
    assert logs.delay(3).get() == [1, 2, 3]
"""


def test_a_users_eager_tests_pass_with_no_servers(tmp_path):
    settings = {
        "KEEL_HOME": str(tmp_path / "home"),
        "KEEL_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
        "KEEL_REDIS_URL": "redis://127.0.0.1:9/0",
        "PYTHONPATH": str(PROJECT_ROOT),
    }
    files = {"test_users_tasks.py": USERS_TESTS}
    done = run_pytest(tmp_path, files, settings, "--noconftest")
    assert "4 passed" in done.stdout, done.stdout

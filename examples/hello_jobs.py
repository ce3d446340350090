# Jobs of your own: keel up --include hello_jobs, started in this folder or with it in KEEL_JOB_PATH
from celery import shared_task

from keel import KeelTask


@shared_task(
    bind=True,
    base=KeelTask,
    name="hello.greet",
    queue="hello",
    autoretry_for=(ConnectionError,),
    retry_backoff=True,
    max_retries=3,
    submittable=True,
)
def greet(self, name: str, flaky_runs: int = 0) -> str:
    if self.request.retries < flaky_runs:  # request.retries is the record's attemptsMade
        raise ConnectionError(f"{name}: not yet (run {self.request.retries + 1})")
    return f"hello, {name}"

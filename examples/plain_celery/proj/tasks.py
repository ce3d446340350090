"""Plain Celery tasks, unchanged: with ``keel.install(app)`` each is a recorded Keel job."""

from proj.celery import app


@app.task
def add(x, y):
    return x + y


@app.task(
    bind=True, autoretry_for=(ConnectionError,), retry_backoff=1, retry_jitter=False, max_retries=3
)
def flaky(self, fails):
    """Fails ``fails`` times with a connection error, then succeeds: retried after 1 s, 2 s."""
    if self.request.retries < fails:
        raise ConnectionError(f"attempt {self.request.retries + 1} could not connect")
    return {"retries": self.request.retries}


@app.task
def resize(image):
    return {"resized": image}  # routed to the "images" queue by task_routes


@app.task
def tick():
    return "tick"

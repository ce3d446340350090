"""Plain Celery tasks, unchanged: with ``keel.install(app)`` each is a recorded Keel job."""

import httpx

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


# --8<-- [start:fetch]
@app.task(autoretry_for=(httpx.TransportError,), retry_backoff=1, max_retries=3)
async def fetch(url):
    """An async task: its awaits run on the worker's event loop (docs/async.md)."""
    async with httpx.AsyncClient() as client:
        response = await client.get(url, timeout=10)
    return response.status_code


# --8<-- [end:fetch]

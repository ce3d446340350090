"""Loading every job module into the app Keel runs on, and the queues they declare."""

from __future__ import annotations

from tasks.jobs.model import registry
from tasks.platform.catalog import celery_queues
from tasks.platform.celery_app import app


def load_job_modules() -> list[str]:
    """Import every job module and bind every task (idempotent); the declared job names.

    The modules are the app's (``imports``, ``include``, and the packages it
    autodiscovers tasks in) with Keel's added to ``include`` (``tasks.assembly``).

    Binding declares Celery-style Keel tasks (``KeelTask.on_bound``), so a
    process that never runs a worker — the API, the CLI — knows them too.
    """
    app.loader.import_default_modules()  # ``imports``, ``include``, ``autodiscover_tasks``
    app.finalize(auto=True)
    return registry.names()


def known_queues() -> list[str]:
    """Every queue a loaded job type runs on (your modules' too), and Celery's declared ones."""
    return sorted(set(celery_queues()) | set(registry.queues()))

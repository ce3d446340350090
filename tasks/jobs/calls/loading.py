"""Loading every job module into the app Keel runs on, and the queues they declare."""

from __future__ import annotations

from importlib import import_module

from tasks.jobs.model import registry
from tasks.platform.catalog import celery_queues
from tasks.platform.celery_app import app


def load_job_modules() -> list[str]:
    """Import every job module and bind every task (idempotent); the declared job names.

    Binding declares Celery-style Keel tasks (``KeelTask.on_bound``), so a
    process that never runs a worker — the API, the CLI — knows them too.
    """
    for module in app.conf.include:
        import_module(module)
    app.finalize(auto=True)
    return registry.names()


def known_queues() -> list[str]:
    """Every queue a loaded job type runs on (your modules' too), and Celery's declared ones."""
    return sorted(set(celery_queues()) | set(registry.queues()))

"""Keel's own Celery app: ``celery -A keel worker|beat|flower``.

It is ``install(Celery("keel"))`` (``tasks.assembly``): a project with a Celery app of
its own calls ``keel.install(app)`` on that one instead, and this module is not loaded.
"""

from __future__ import annotations

from celery import Celery

from tasks.assembly import install

app = install(Celery("keel"))

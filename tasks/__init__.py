"""Keel's back end: the Celery app, the generic job layer and the job modules."""

from __future__ import annotations

from tasks.celery import app

__all__ = ["app"]

"""A Django project whose Celery app is a Keel app (``proj/celery.py``)."""

# Celery's Django guide: the app is loaded with Django, so @shared_task binds to it.
from proj.celery import app as celery_app

__all__ = ("celery_app",)

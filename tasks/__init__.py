"""Keel's back end: the Celery app, the generic job layer and the job modules.

The app lives in ``tasks.celery`` and is built only when that module is
imported: configuration, models and the ``keel`` command import ``tasks``
without paying for Celery. ``celery -A tasks`` still finds it, because Celery
looks for ``tasks.celery`` when the package itself has no ``app`` attribute.
"""

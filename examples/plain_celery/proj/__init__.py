"""A Celery project of its own, made a Keel app by one call (``proj/celery.py``)."""

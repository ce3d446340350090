"""Celery's API over the records: a Keel task's ``apply_async`` and retries
(``celery_task``), and the Celery signals the job layer answers (``signals``)."""

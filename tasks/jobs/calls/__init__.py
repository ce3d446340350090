"""Celery's API over the records: a Keel task's ``apply_async`` and retries
(``celery_task``), its ``AsyncResult`` (``async_result``: ``.get()`` by the failure
policies; read through ``result_backend``), and the Celery signals the job layer answers
(``signals``)."""

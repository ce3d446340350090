"""Keel's infrastructure: what every layer above stands on, and that knows none of them.

Settings (``config``, ``setting_types``, ``stacks``), the database (``db``,
``migrate``), the broker (``broker``, ``transport``, ``pipelined``, ``consumer``,
``rabbitmq``, ``kombu_members``, ``deadletters``), Celery's event dispatcher
(``celery_events``), logs, traces and tallies (``logs``, ``tracing``, ``tallies``),
and small shared rules (``ids``, ``deadline``, ``quotas``). A new piece of
infrastructure goes here. Nothing here imports the job layer (``tasks.jobs``), the
job apps, the Celery app's assembly (``tasks.celery``) or ``web``/``keel``: the
import contracts in ``pyproject.toml`` check it. These modules are internal: they may
change without notice; the public API is ``keel``.
"""

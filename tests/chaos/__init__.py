"""Chaos tests: faults and outages, with nothing lost or duplicated.

Each scenario kills, restarts or stops a real process (a ``celery worker``,
the embedded Redis, the embedded Postgres) while jobs are in flight, and
asserts its pass figure from the records: jobs completed out of jobs
accepted, completed runs per job, artifact rows per operation key.

The fast variants run in the default ``pytest`` run; the long ones (30 s
outages, the full-size runs and the soak) are marked ``slow``::

    .venv/bin/pytest -m slow tests/chaos          # slow tier only
    KEEL_SOAK_SECONDS=90 .venv/bin/pytest -m slow tests/chaos -k soak -s
"""

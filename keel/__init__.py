"""Keel's command line and process supervisor: ``keel up``, ``keel token``, ``keel db``, ...

Neither is HTTP nor a job: the command line drives the job layer (``tasks``)
and the API (``web``) from a shell, and ``keel up`` runs the whole stack —
embedded Postgres and Redis (``keel.embedded``), worker, beat, Flower, the
provider sandbox and the web app — under one supervisor that owns its home.
"""

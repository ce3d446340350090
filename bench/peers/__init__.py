"""Other Postgres-backed job queues beside Keel in P1 and P2: procrastinate and pgqueuer.

Each peer keeps its own tables in the bench's database, runs its own worker
CLI with two jobs at a time, and is told the end of a batch by its own
records. Both are optional (the ``bench`` extra installs them): a figure
measures the peers that import and says which it left out.
"""

from __future__ import annotations

import os


def database_url() -> str:
    """The bench's database as libpq reads it (no SQLAlchemy ``+driver`` in the scheme)."""
    url = os.environ.get("KEEL_DATABASE_URL")
    if not url:
        raise RuntimeError("KEEL_DATABASE_URL is not set (python -m bench sets it for its workers)")
    scheme, sep, rest = url.partition("://")
    return scheme.split("+", 1)[0] + sep + rest

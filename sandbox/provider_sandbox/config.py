"""The sandbox's own settings, from its environment: it imports nothing of Keel.

``KEEL_SANDBOX_PORT`` (8025), ``KEEL_SANDBOX_HOME`` (else ``$KEEL_HOME/sandbox``,
else ``./.keel/sandbox``), ``KEEL_SANDBOX_ADMIN_KEY`` (unset: ``/admin`` and
``/v1/ledger`` answer 401) and ``KEEL_SANDBOX_CAPACITY`` (10,000 messages per
group). The names share Keel's prefix so one environment serves both, but
the sandbox stands in for a third party and reads them itself.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8025
DEFAULT_CAPACITY = 10_000


def port() -> int:
    return int(os.environ.get("KEEL_SANDBOX_PORT") or DEFAULT_PORT)


def home() -> Path:
    explicit = os.environ.get("KEEL_SANDBOX_HOME")
    if explicit:
        return Path(explicit).resolve()
    return (Path(os.environ.get("KEEL_HOME") or ".keel") / "sandbox").resolve()


def admin_key() -> str:
    return os.environ.get("KEEL_SANDBOX_ADMIN_KEY", "")


def capacity() -> int:
    """Group capacity until ``PUT /admin/config`` says otherwise."""
    return int(os.environ.get("KEEL_SANDBOX_CAPACITY") or DEFAULT_CAPACITY)

"""The job store: every statement on the job tables lives in this package.

- ``jobs``: the ``jobs`` table — each state transition is one statement,
  guarded where it must be by the lock token of the claim;
- ``dedup``: deduplication claims, taken in the same transaction as the insert;
- ``counts``: the per-state counters fed by a trigger, for queue health;
- ``listing``: pages of records, newest first, for the jobs API and the CLI.

The lifecycle modules (``enqueue``, ``execute``, ``finish``, ``promote``,
``stalls``, ``manual_retry``, ``cancel``, ``maintenance``) own the transactions and call
these named operations; nothing else writes SQL against these tables.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy.engine import CursorResult, Result


def affected(result: Result[Any]) -> int:
    """How many rows an UPDATE or DELETE touched (``Result`` is typed without it)."""
    return cast(CursorResult[Any], result).rowcount or 0

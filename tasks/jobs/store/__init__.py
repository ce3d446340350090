"""The job store: every statement on the job tables lives in this package.

- ``jobs``: the ``jobs`` records — adding them (``admission`` for an add that
  takes a dedup claim or checks a quota in the same statement), cancelling
  them, an operator's reads and retries;
- ``runs``: a run's claim, progress and end, each one statement guarded by
  the lock token of the claim;
- ``upkeep``: what maintenance does to many records at once (promotion,
  stalled runs, retention trims) and the reconciler's reads;
- ``canvas``: chord bodies and the parts they count;
- ``dedup``: deduplication claims, taken in the same transaction as the insert;
- ``counts``: the per-state counters fed by a trigger, for queue health;
- ``listing``: pages of records, newest first, for the jobs API and the CLI.

The lifecycle modules (``enqueue``, ``execute``, ``finish``, ``promote``,
``stalls``, ``manual_retry``, ``cancel``, ``maintenance``) own the transactions and call
these named operations; nothing else writes these tables, by SQL or by the ORM (the
audit trail's rows included: ``jobs.add_action``). A structure test
(``tests/unit/test_architecture.py``) holds every table of the job layer's models to it,
and an import contract keeps every layer above the job layer out of this package (what
they read of it, they read through ``tasks.jobs.observe`` and ``tasks.jobs.upkeep``).
"""

from __future__ import annotations

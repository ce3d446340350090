"""The job store: every statement on the job tables lives in this package.

- ``jobs``: the ``jobs`` table — each state transition is one statement,
  guarded where it must be by the lock token of the claim;
- ``dedup``: deduplication claims, taken in the same transaction as the insert;
- ``counts``: the per-state counters fed by a trigger, for queue health.

The lifecycle modules (``enqueue``, ``execute``, ``finish``, ``promote``,
``stalls``, ``manual_retry``, ``maintenance``) own the transactions and call
these named operations; nothing else writes SQL against these tables.
"""

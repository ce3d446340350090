"""How many jobs each queue holds, by state: what queue views, health and metrics read.

The counters are the store's (``tasks.jobs.store.counts``: per-state counters fed by a
trigger); this is the job layer's interface to them for the layers above it.
"""

from __future__ import annotations

from tasks.jobs.store.counts import by_queue as by_queue
from tasks.jobs.store.counts import by_queue_of_every_tenant as by_queue_of_every_tenant
from tasks.jobs.store.counts import counts as counts
from tasks.jobs.store.counts import due_delayed as due_delayed
from tasks.jobs.store.counts import oldest_waiting_s as oldest_waiting_s

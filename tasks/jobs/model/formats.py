"""The versions of what one release writes and another reads: messages and records.

A rolling upgrade runs two releases side by side (docs/operations/upgrading.md): the
new release's API records jobs that old workers claim, and the reverse, and
each publishes messages the other consumes. So both layouts carry a number:

- a job's task message says its format in the ``keel`` header (a message
  without the header comes from plain Celery and is recorded on arrival);
- a job's record says its format in ``jobs.format`` (migration 0010; an
  insert that does not name it, as the previous release's do, writes 1).

A release reads the formats in ``*_READ`` and writes ``*_FORMAT``. Changing a
layout takes two releases: the first learns to read the new format (adds it
to ``*_READ``) while still writing the old one; the next writes it. So a
worker never meets a format newer than it reads during an upgrade from the
release before. If one does (a release skipped), it leaves the job alone
rather than misread it: the claim refuses a newer record, and a newer
message is acknowledged without a run, the record left waiting for a newer
worker (the reconciler publishes a waiting job again if its message is gone).

A new job option needs no new format: it goes to ``jobs.extra_opts``, which releases
read leniently (``tasks.jobs.model.options.JobOptions.columns``), never to ``jobs.opts``.
"""

from __future__ import annotations

# The header a job's task message says its format in (``tasks.platform.headers``).
from tasks.platform.headers import KEEL_HEADER as KEEL_HEADER

MESSAGE_FORMAT = 1
MESSAGE_FORMATS_READ = frozenset({1})
RECORD_FORMAT = 1
RECORD_FORMATS_READ = frozenset({1})


def message_format(header: object) -> int | None:
    """The format a ``keel`` header names; None without one (a plain Celery message).

    Releases before the formats were numbered wrote ``"1"``, which is format 1. A value
    that is not a number is an unknown format (-1): never read as any known one.
    """
    if header is None or header == "":
        return None
    try:
        return int(str(header))
    except ValueError:
        return -1


def reads_message(header: object) -> bool:
    """Whether this release reads a message with this ``keel`` header."""
    found = message_format(header)
    return found is None or found in MESSAGE_FORMATS_READ

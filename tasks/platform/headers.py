"""The task message header that marks a job Keel recorded before publishing it.

Only a message Keel sent for a job it recorded first carries it
(``tasks.jobs.intake.messages``); the transport reads it (``tasks.platform.transport``).
Its value is the message format (``tasks.jobs.model.formats``).
"""

from __future__ import annotations

KEEL_HEADER = "keel"

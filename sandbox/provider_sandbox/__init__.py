"""A fake messaging provider's group API, for dev and tests.

It stands in for the third party a notification campaign sends through:
real HTTP, real persistence, the real provider's quirks (1,000 messages per
request, a capacity past which messages vanish silently, one send per group)
and failures on demand, plus a ledger the real one doesn't offer, so tests
can check what was actually accepted and sent. Run it with
``python -m provider_sandbox --port 8025``.
"""

from __future__ import annotations

from provider_sandbox.app import create_app
from provider_sandbox.server import serve

__all__ = ["create_app", "serve"]

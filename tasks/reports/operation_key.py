"""The operation key: which requests are the same piece of work."""

from __future__ import annotations

import hashlib
import json

OPERATION = "report.generate.v1"


def operation_key(tenant_id: str, user_id: str, report_id: str, rows: int) -> str:
    """sha256 over the JSON of ``[operation, tenant, user, reportId, rows]``.

    Serialised like JavaScript's ``JSON.stringify`` (no spaces, UTF-8), so the
    key matches one computed by a BullMQ producer for the same request.
    """
    payload = json.dumps(
        [OPERATION, tenant_id, user_id, report_id, rows], separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()

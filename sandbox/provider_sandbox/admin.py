"""What the real provider doesn't have: the admin API and the ledger.

Tests steer the sandbox through ``/admin`` (faults, capacity, reset) and
check its account through ``GET /v1/ledger``. Faults never touch these
routes, so the oracle stays readable while the provider API misbehaves.

Both need the admin key (``KEEL_SANDBOX_ADMIN_KEY``, which ``keel up``
generates) in the ``X-Sandbox-Admin-Key`` header, and bodies must be
``application/json``: a web page open in a browser on the same machine can
send neither, so it cannot reset the sandbox or read its ledger. Without a
configured key the routes are closed.
"""

from __future__ import annotations

import hmac

from flask import Blueprint, current_app, request

from provider_sandbox import payloads
from provider_sandbox.errors import AdminKeyRequired, InvalidRequest, JsonOnly
from provider_sandbox.faults import Faults
from provider_sandbox.ledger import ledger
from provider_sandbox.state import current

ADMIN_KEY_HEADER = "X-Sandbox-Admin-Key"
ADMIN_KEY_CONFIG = "SANDBOX_ADMIN_KEY"

admin = Blueprint("admin", __name__, url_prefix="/admin")
ledger_bp = Blueprint("ledger", __name__)


def _require_admin() -> None:
    expected = current_app.config.get(ADMIN_KEY_CONFIG) or ""
    given = request.headers.get(ADMIN_KEY_HEADER, "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise AdminKeyRequired()
    if request.method in ("POST", "PUT", "PATCH") and request.mimetype != "application/json":
        raise JsonOnly()


admin.before_request(_require_admin)
ledger_bp.before_request(_require_admin)


@admin.get("/faults")
def read_faults():
    return current().faults.faults.to_json()


@admin.put("/faults")
def replace_faults():
    faults = Faults.from_json(payloads.json_object(request))
    current().set_faults(faults)
    return faults.to_json()


@admin.get("/config")
def read_config():
    return {"capacity": current().capacity()}


@admin.put("/config")
def replace_config():
    body = payloads.json_object(request)
    payloads.only_fields(body, {"capacity"})
    capacity = payloads.integer(body, "capacity", low=1)
    if capacity is None:
        raise InvalidRequest("capacity is required", details=[{"field": "capacity"}])
    current().set_capacity(capacity)
    return {"capacity": capacity}


@admin.post("/reset")
def reset():
    current().reset()
    return "", 204


@ledger_bp.get("/v1/ledger")
def read_ledger():
    payloads.only_fields(request.args, {"groupId", "summary"}, where="query")
    summary = payloads.flag(request, "summary")
    sandbox = current()
    with sandbox.store.snapshot() as db:
        body = ledger(db, group_id=request.args.get("groupId"), summary=summary)
    return {"capacity": sandbox.capacity(), **body}

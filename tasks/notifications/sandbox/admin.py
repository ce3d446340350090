"""What the real provider doesn't have: the admin API and the ledger.

Tests steer the sandbox through ``/admin`` (faults, capacity, reset) and
check its account through ``GET /v1/ledger``. Faults never touch these
routes, so the oracle stays readable while the provider API misbehaves.
"""

from __future__ import annotations

from flask import Blueprint, request

from tasks.notifications.sandbox import payloads
from tasks.notifications.sandbox.errors import InvalidRequest
from tasks.notifications.sandbox.faults import Faults
from tasks.notifications.sandbox.ledger import ledger
from tasks.notifications.sandbox.state import current

admin = Blueprint("admin", __name__, url_prefix="/admin")
ledger_bp = Blueprint("ledger", __name__)


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

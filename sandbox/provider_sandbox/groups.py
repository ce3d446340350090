"""The provider's group API under ``/v1/groups``, where faults strike.

Create a group, add messages in batches of at most 1,000, trigger the send
once, read the status. Like the real provider, messages past the group's
capacity are dropped without a word in the response: the only trace is the
group's ``count`` (and the sandbox's ledger).
"""

from __future__ import annotations

import logging
import socket

from flask import Blueprint, Response, g, make_response, request

from provider_sandbox import payloads
from provider_sandbox.errors import Unavailable, error_response
from provider_sandbox.state import current

log = logging.getLogger(__name__)
bp = Blueprint("groups", __name__, url_prefix="/v1/groups")


@bp.before_request
def suffer_faults() -> None:
    faults = current().faults
    scope = faults.faults.path_contains
    if scope and scope not in request.path:
        return
    g.fate = faults.admit()
    faults.inflict(g.fate)


@bp.after_request
def lose_response(response: Response) -> Response:
    """After the change is committed, make the client believe it failed."""
    fate = g.get("fate")
    if fate is None or not fate.drop_response or fate.timeout or fate.error:
        return response
    sock = request.environ.get("werkzeug.socket")
    if current().faults.faults.drop_response_mode == "close" and sock is not None:
        sock.shutdown(socket.SHUT_RDWR)  # the client sees the connection die, no response
    return make_response(error_response(Unavailable("the response was lost")))


@bp.post("")
def create_group():
    name = payloads.group_name(payloads.json_object(request, required=False))
    key = request.headers.get("Idempotency-Key") or None
    group = current().store.create_group(name, key)
    return {"groupId": group.group_id}, 201


@bp.post("/<group_id>/messages")
def add_messages(group_id: str):
    messages = payloads.messages(payloads.json_object(request))
    sandbox = current()
    added = sandbox.store.add_messages(group_id, messages, sandbox.capacity())
    if added.dropped:
        log.info("group %s is full: dropped %d messages silently", group_id, added.dropped)
    return {"accepted": added.new, "duplicates": added.duplicates}


@bp.post("/<group_id>/send")
def send_group(group_id: str):
    group = current().store.send(group_id)
    return {"groupId": group.group_id, "count": group.count, "sentAt": group.sent_at}, 202


@bp.get("/<group_id>")
def group_status(group_id: str):
    return current().store.group(group_id).to_json()


@bp.delete("/<group_id>")
def delete_group(group_id: str):
    current().store.delete_group(group_id)
    return "", 204

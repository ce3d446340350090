"""``Idempotency-Key`` on the API's creating endpoints: a request sent twice does its work once.

A client that times out and sends ``POST /api/v1/jobs`` again cannot know whether the
first one made a job. With the same ``Idempotency-Key`` header (any 1..255 visible ASCII
characters, or a quoted string, as the IETF draft writes it) on both, per user of a tenant:

- the first request runs and its answer is kept for ``KEEL_IDEMPOTENCY_TTL_S`` (24 h);
- the same key with the same request (method, path and JSON body) answers that answer
  again, status and body, with ``Idempotent-Replayed: true`` — the same job;
- the same key with another request is ``422 idempotency_key_reused``;
- sent while the first still runs, it waits for that answer (a short while, within the
  request's deadline), else ``409 idempotency_key_in_use`` with ``Retry-After``;
- a first request that failed (any 4xx or 5xx) keeps nothing: sent again, it runs again.

Concurrent requests with one key make one job: one of them claims the key
(``tasks.jobs.intake.idempotency``), the others wait for its answer. And a server that
dies between making the job and storing its answer does not make a second one when the
client sends again: ``POST /jobs`` derives the job's id from the user and the key
(``job_id_for``), so the retry finds the job the first one made (the other endpoints
run again then).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request

from tasks.jobs.intake import idempotency
from tasks.platform.config import get_settings
from web.errors import ApiError

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY = 255
WAIT_S = 0.6  # within the request's 1 s deadline, with room for the replay itself
POLL_S = 0.02


def key_of_request() -> str | None:
    """The request's key (an IETF structured string's quotes taken off), or None; 400 if it
    is not one."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    key = raw.strip()
    if len(key) > 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not 1 <= len(key) <= MAX_KEY or not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ApiError(
            400,
            f"{HEADER} must be 1..{MAX_KEY} visible ASCII characters",
            code="validation_failed",
            details=[{"field": HEADER, "type": "header"}],
        )
    return key


def job_id_for(tenant: str, user: str, key: str) -> str:
    """The job id a ``POST /jobs`` with this key makes: a retry finds the first one's job."""
    seen = f"keel-idempotency\x1f{tenant}\x1f{user}\x1f{key}"
    return hashlib.sha256(seen.encode()).hexdigest()[:32]


def _fingerprint() -> str:
    try:
        body = json.dumps(request.get_json(silent=True), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        body = request.get_data(as_text=True)
    seen = f"{request.method}\x1f{request.path}\x1f{body}"
    return hashlib.sha256(seen.encode()).hexdigest()


def run_once(view: Callable[[], Any]) -> Any:
    """``view``'s answer, or the answer the request's key already holds (see the module)."""
    key = key_of_request()
    if key is None:
        return view()
    who = idempotency.Who(g.principal.tenant_id, g.principal.user_id)
    fingerprint = _fingerprint()
    found = _claim_or_wait(who, key, fingerprint)
    if not found.claimed:
        return _replay(found)
    g.idempotency_key = key
    try:
        response = current_app.make_response(view())
    except BaseException:
        idempotency.release(who, key)
        raise
    if 200 <= response.status_code < 300 and response.is_json:
        idempotency.complete(who, key, response.status_code, response.get_json())
    else:
        idempotency.release(who, key)
    return response


def _claim_or_wait(who: idempotency.Who, key: str, fingerprint: str) -> idempotency.Found:
    """The key claimed by this request, or the other request's record once it answered."""
    until = time.monotonic() + WAIT_S
    ttl_s = get_settings().idempotency_ttl_s
    while True:
        found = idempotency.claim(who, key, fingerprint, ttl_s)
        if found.claimed:
            return found
        if found.fingerprint is not None:  # (None: given back just now; claimed next round)
            if found.fingerprint != fingerprint:
                raise ApiError(
                    422,
                    f"this {HEADER} was sent with another request: use a new key for it",
                    code="idempotency_key_reused",
                )
            if found.status is not None:
                return found
        if time.monotonic() >= until:
            raise ApiError(
                409,
                f"a request with this {HEADER} is still running: send it again shortly",
                code="idempotency_key_in_use",
                headers={"Retry-After": "1"},
            )
        time.sleep(POLL_S)


def _replay(found: idempotency.Found) -> Response:
    response = current_app.response_class(
        json.dumps(found.response), status=found.status, mimetype="application/json"
    )
    response.headers[REPLAYED] = "true"
    return response

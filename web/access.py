"""The API's access log, and the request id every line of a request carries.

One line per request on the ``keel.access`` logger, written when the view has answered (for
an event stream: when the stream starts): ``method``, ``route`` (the URL rule's template,
``/api/v1/jobs/<job_id>``, never the path or its query, which may hold a sign-in token),
``status``, ``duration_ms``, ``request_id``, once the caller is known ``tenant_id``, and
the ``job_id`` an answer names (``{"jobId": …}``: the job a POST added).
Never a header: the bearer token stays out (``tasks.platform.logs.redact`` would mask it anyway).

The request id is the caller's ``X-Request-ID`` when it is a plain token (letters, digits,
``._:-``, at most 128), else a new one; the response carries it back in ``X-Request-ID``.
Every line logged during the request carries it (``tasks.platform.logs.bind``).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from flask import Flask, Response, g, request

from tasks.platform import logs
from web import http_metrics

log = logging.getLogger("keel.access")

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
HEADER = "X-Request-ID"


def init_app(app: Flask) -> None:
    """Registered first, so that it runs before any other hook can answer the request."""
    app.before_request_funcs.setdefault(None, []).insert(0, _begin)
    app.after_request(_answered)
    app.teardown_request(_end)


def _begin() -> None:
    given = request.headers.get(HEADER, "")
    request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
    scope = logs.bind(request_id=request_id)
    g.log_fields = scope.__enter__()
    g.log_scope = scope
    g.request_id = request_id
    g.request_began = time.perf_counter()


def note_tenant(tenant_id: str | None) -> None:
    """Called once the caller is known (``web.auth``): its lines carry its tenant."""
    fields = g.get("log_fields")
    if fields is not None and tenant_id:
        fields["tenant_id"] = tenant_id


def _answered(response: Response) -> Response:
    request_id = g.get("request_id")
    if request_id is None:  # answered before ``_begin`` ran (cannot happen: it is first)
        return response
    response.headers[HEADER] = request_id
    rule = request.url_rule
    took = time.perf_counter() - g.request_began
    route = rule.rule if rule is not None else "<unmatched>"
    http_metrics.observe(
        http_metrics.method_label(request.method), route, response.status_code, took
    )
    extra: dict[str, Any] = {
        "method": request.method,
        "route": route,
        "status": response.status_code,
        "duration_ms": round(took * 1000, 2),
        "request_id": request_id,
    }
    principal = g.get("principal")
    if principal is not None:
        extra["tenant_id"] = principal.tenant_id
    job_id = _job_added(response)
    if job_id is not None:  # the job this request added: the worker's lines carry it too
        extra["job_id"] = job_id
    log.info("%s %s %s", extra["method"], extra["route"], extra["status"], extra=extra)
    return response


def _job_added(response: Response) -> str | None:
    """The ``jobId`` of an answer that added or names one job (a small JSON body)."""
    if response.is_streamed or response.mimetype != "application/json":
        return None
    body = response.get_json(silent=True)
    job_id = body.get("jobId") if isinstance(body, dict) else None
    return job_id if isinstance(job_id, str) else None


def _end(exc: BaseException | None) -> None:
    scope = g.pop("log_scope", None)
    if scope is not None:
        scope.__exit__(None, None, None)

"""The webhook delivery job (``keel.webhook.deliver``): post one event to one endpoint,
signed, and fail (to be retried with backoff, by the job's attempts) unless it answers 2xx.

The address a delivery reaches is the one it connected to, checked before anything is
sent (``check_address``): a host name that resolves to this machine or a private network,
at registration or later (DNS rebinding), is refused like a literal one, unless an
operator allowed that network (``KEEL_WEBHOOK_ALLOW``). Redirects are not followed: a
3xx is a failed attempt. A removed endpoint ends its deliveries failed, without retries.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from tasks.jobs.model import webhooks
from tasks.jobs.model.errors import UnrecoverableError
from tasks.jobs.run.context import JobContext
from tasks.jobs.run.execute import handler
from tasks.jobs.store import webhooks as store
from tasks.platform.config import get_settings
from tasks.platform.db import transaction
from tasks.platform.setting_types import parse_networks

USER_AGENT = "Keel-Webhooks/1"
KEPT_ANSWER = 500  # characters of a refusing endpoint's answer kept in the failure reason


class DeliveryFailed(Exception):
    """The endpoint did not take the event (no answer, or not 2xx): the job runs again."""


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        secure = http.client.HTTPSConnection(
            host, parts.port, timeout=timeout_s, context=ssl.create_default_context()
        )
        return secure, path
    return http.client.HTTPConnection(host, parts.port, timeout=timeout_s), path


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """``(status, the answer's start)`` of posting ``body`` to ``url``, once its peer's address
    passed ``check_address`` (``WebhookRefused`` otherwise, before anything is sent)."""
    allowed = parse_networks(get_settings().webhook_allow)
    webhooks.check_url(url, allowed)
    connection, path = _connection(url, timeout_s)
    try:
        connection.connect()
        assert connection.sock is not None
        peer = ipaddress.ip_address(connection.sock.getpeername()[0].split("%", 1)[0])
        webhooks.check_address(peer, allowed)
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read(KEPT_ANSWER).decode("utf-8", "replace")
    finally:
        connection.close()


def headers_for(secret: str, event: dict[str, Any], body: bytes) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Keel-Webhook-Id": str(event.get("id", "")),
        "Keel-Event": str(event.get("type", "")),
        webhooks.SIGNATURE_HEADER: webhooks.sign(secret, int(time.time()), body),
    }


@handler(webhooks.DELIVER, queue=webhooks.QUEUE, events=False)
def deliver(job: JobContext) -> dict[str, Any]:
    """Post the job's event to its endpoint; the endpoint's status is the result."""
    endpoint_id, event = job.data["endpointId"], job.data["event"]
    with transaction() as session:
        endpoint = store.get(session, None, endpoint_id)
        url, secret = (endpoint.url, endpoint.secret) if endpoint is not None else ("", "")
    if endpoint is None:
        raise UnrecoverableError(f"webhook endpoint {endpoint_id} was removed")
    body = json.dumps(event, separators=(",", ":"), default=str).encode()
    try:
        status, answer = post(url, body, headers_for(secret, event, body), _timeout_s())
    except webhooks.WebhookRefused as exc:
        raise UnrecoverableError(str(exc)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryFailed(f"{_host(url)}: {type(exc).__name__}: {exc}") from None
    if not 200 <= status < 300:
        raise DeliveryFailed(f"{_host(url)} answered {status}: {answer.strip()[:200]}")
    return {"status": status, "endpointId": endpoint_id}


def _timeout_s() -> float:
    return get_settings().webhook_timeout_s


def _host(url: str) -> str:
    return urlsplit(url).netloc

"""The webhook delivery job (``keel.webhook.deliver``): post one event to one endpoint,
signed, and fail (to be retried with backoff, by the job's attempts) unless it answers 2xx.

The host's addresses are resolved and checked before any packet goes to them
(``vetted_address``), and the connection is made to the checked address: a host name
that resolves to this machine or a private network, at registration or later (DNS
rebinding), is refused like a literal one, unless an operator allowed that network
(``KEEL_WEBHOOK_ALLOW``); the refusal does not say which address it was. Redirects are
not followed: a 3xx is a failed attempt. A removed endpoint ends its deliveries failed,
without retries.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
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
from tasks.platform.setting_types import Network, parse_networks

USER_AGENT = "Keel-Webhooks/1"
KEPT_ANSWER = 500  # characters of a refusing endpoint's answer kept in the failure reason


class DeliveryFailed(Exception):
    """The endpoint did not take the event (no answer, or not 2xx): the job runs again."""


def vetted_address(host: str, port: int, allowed: tuple[Network, ...]) -> str:
    """The address to connect to for ``host``: every address it resolves to must pass
    ``check_address`` (a name with one private address among public ones is refused too),
    before any packet goes to any of them. ``WebhookRefused`` says no more than that: the
    refused address is not told (a tenant must not map the network behind Keel with it)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except UnicodeError:
        raise webhooks.WebhookRefused(f"{host!r} is not a host name") from None
    except OSError as exc:  # the name service away, or no such name (yet): tried again
        raise DeliveryFailed(f"{host}: cannot be resolved ({type(exc).__name__})") from None
    addresses = [str(info[4][0]).split("%", 1)[0] for info in found]
    for address in addresses:
        try:
            webhooks.check_address(ipaddress.ip_address(address), allowed)
        except webhooks.WebhookRefused:
            raise webhooks.WebhookRefused(
                f"{host} resolves to an address webhooks may not reach (this machine or a "
                "private network: KEEL_WEBHOOK_ALLOW)"
            ) from None
    return addresses[0]


def _connection(
    url: str, timeout_s: float, allowed: tuple[Network, ...]
) -> tuple[http.client.HTTPConnection, str]:
    """A connection to ``url``'s host that connects to its vetted address only (TLS still
    checks the certificate against the name)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    address = vetted_address(host, port, allowed)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context()
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def to_the_vetted_address(_where: Any, timeout: Any, source: Any = None) -> socket.socket:
        return socket.create_connection((address, port), timeout, source)

    connection._create_connection = to_the_vetted_address  # type: ignore[attr-defined]
    return connection, path


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """``(status, the answer's start)`` of posting ``body`` to ``url``: its host's addresses
    resolved and checked (``vetted_address``) before connecting, and the connection made to
    the checked address (no second lookup for a DNS rebinding to change)."""
    allowed = parse_networks(get_settings().webhook_allow)
    webhooks.check_url(url, allowed)
    connection, path = _connection(url, timeout_s, allowed)
    try:
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

"""Webhooks, as pure rules: the event types, what a delivery carries and how it is signed,
and which addresses a delivery may reach.

A tenant registers endpoints (``POST /api/v1/webhooks``) for event types. When one of
its jobs ends, the transaction that records the end also adds, for each endpoint that
takes the event, a delivery job (``DELIVER``) holding the event: committed with the
end or not at all, so no event is lost to a crash and none is made twice (the
delivery's job id derives from the endpoint, the job and the event). The delivery
posts the event, signed, and is retried with backoff like any job until the endpoint
answers 2xx.

The signature (``Keel-Signature: t=<unix seconds>,v1=<hex>``) is the HMAC-SHA256,
keyed with the endpoint's secret, of ``<t>.<body>``: a receiver recomputes it over the
raw body and refuses a ``t`` older than a few minutes (a replayed delivery).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from tasks.platform.builtins import WEBHOOKS_QUEUE
from tasks.platform.setting_types import Network

DELIVER = "keel.webhook.deliver"
QUEUE = WEBHOOKS_QUEUE
JOB_EVENTS = ("job.completed", "job.failed", "job.cancelled")
# A tenant's own pause of a queue lifted or set (not a system-wide one: no tenant's), and a
# campaign's report, once every message of it was sent.
EVENT_TYPES = (*JOB_EVENTS, "queue.paused", "queue.resumed", "campaign.finished")
SIGNATURE_HEADER = "Keel-Signature"
MAX_RESULT_BYTES = 16_384  # a completed job's result rides in the event up to this size
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookRefused(ValueError):
    """An endpoint or a delivery target Keel will not post to (the message says why)."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Keel-Signature`` header's value for ``body`` sent at ``timestamp``."""
    signed = str(timestamp).encode() + b"." + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, now: int, tolerance_s: int = 300) -> bool:
    """What a receiver checks: the signature over ``body``, made within ``tolerance_s``."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


def delivery_id(endpoint_id: str, job_id: str, event: str) -> str:
    """The delivery job's id: one per endpoint, job and event, however often it is asked."""
    digest = hashlib.sha256(f"{endpoint_id}\n{job_id}\n{event}".encode()).hexdigest()[:32]
    return f"webhook:{endpoint_id}:{digest}"


def job_event(job: Any, state: str, *, reason: str | None, result: Any) -> dict[str, Any]:
    """The event a job's end posts (``job`` has the record's ``id, name, queue``): a failed
    job's ``failedReason``, a cancelled one's ``reason``, a completed one's ``result``."""
    data: dict[str, Any] = {"jobId": job.id, "name": job.name, "queue": job.queue, "state": state}
    if reason is not None:
        data["failedReason" if state == "failed" else "reason"] = reason
    if state == "completed":
        encoded = json.dumps(result, default=str)
        if len(encoded) <= MAX_RESULT_BYTES:
            data["result"] = result
        else:
            data["resultOmitted"] = True  # read it from GET /api/v1/jobs/<id>
    return {"type": f"job.{state}", "data": data}


def check_url(url: str, allowed: tuple[Network, ...]) -> str:
    """``url`` if Keel may post to it as given: http(s), a host, no credentials, and not a
    literal address of this machine or a private network unless ``allowed`` holds it (a host
    name is checked again at each delivery, against the address it connects to)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": a bracket that opens no address
        raise WebhookRefused(f"the URL cannot be read: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookRefused("the URL must be http:// or https://")
    if not parts.hostname:
        raise WebhookRefused("the URL has no host")
    if parts.username or parts.password:
        raise WebhookRefused("the URL may not hold credentials (the signature authenticates)")
    try:
        _ = parts.port
    except ValueError:
        raise WebhookRefused("the URL's port is not a port number") from None
    host = parts.hostname
    try:
        host.encode("idna")
    except UnicodeError:
        raise WebhookRefused(f"{host!r} is not a host name") from None
    if host.rstrip(".") == "localhost" or host.rstrip(".").endswith(".localhost"):
        check_address(ipaddress.ip_address("127.0.0.1"), allowed)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return url
    check_address(literal, allowed)
    return url


# IPv6 prefixes that carry an IPv4 address in their last 32 bits: NAT64 (well-known and
# local-use), IPv4-compatible, and SIIT's IPv4-translated (RFC 6052, 4291, 2765).
_IPV4_IN_LAST_32 = tuple(
    ipaddress.IPv6Network(net)
    for net in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96")
)


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to, if it embeds one (mapped, 6to4, Teredo's
    client, NAT64, IPv4-compatible, SIIT): where a packet to it ends up on a network that
    translates it."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in _IPV4_IN_LAST_32) and int(address) > 1:  # not ::, ::1
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def check_address(address: Address, allowed: tuple[Network, ...]) -> None:
    """Refuse an address that is not on the public internet (loopback, private, link-local,
    multicast, reserved…), unless an operator allowed its network (``KEEL_WEBHOOK_ALLOW``)."""
    address = embedded_ipv4(address) or address
    if any(address in network for network in allowed):
        return
    site_local = isinstance(address, ipaddress.IPv6Address) and address.is_site_local
    if not address.is_global or address.is_multicast or site_local:
        raise WebhookRefused(
            f"{address} is not a public address: webhooks do not reach this machine or "
            "private networks unless KEEL_WEBHOOK_ALLOW lists them"
        )

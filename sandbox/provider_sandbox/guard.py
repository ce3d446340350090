"""Only its clients reach the sandbox: not a web page in the developer's browser.

The sandbox listens on loopback under ``keel up``, where any page open in a
browser on the same machine can send it requests: a cross-site ``text/plain``
POST needs no preflight (CSRF), and a domain of the attacker's that resolves
to 127.0.0.1 makes the browser treat the sandbox as that domain (DNS
rebinding). So, before any route:

- a request naming a ``Host`` the sandbox does not answer to is refused
  (403): it answers to IP addresses, ``localhost`` and single-label names
  (``sandbox`` in compose), and to the names in ``KEEL_SANDBOX_HOSTS``
  (comma-separated) — never to an outside domain name;
- a request whose ``Origin`` is not the sandbox's own is refused (403):
  browsers send ``Origin`` on cross-site requests, Keel's client never does;
- a body that is not ``application/json`` is refused (415).
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from flask import Flask, request

from provider_sandbox.errors import JsonOnly, ProviderError


class Forbidden(ProviderError):
    """The sandbox answers its own clients only."""

    status = 403
    code = "forbidden"


def _hostname(netloc: str) -> str:
    return (urlsplit(f"//{netloc}").hostname or "").rstrip(".").lower()


def host_allowed(hostname: str) -> bool:
    if hostname in ("localhost", "") or "." not in hostname:
        return hostname != ""
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        extra = os.environ.get("KEEL_SANDBOX_HOSTS", "")
        return hostname in {h.strip().lower() for h in extra.split(",") if h.strip()}
    return True


def _guard() -> None:
    host = request.headers.get("Host", "")
    if not host_allowed(_hostname(host)):
        raise Forbidden("this host name is not the sandbox's (set KEEL_SANDBOX_HOSTS)")
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
        raise Forbidden("cross-origin requests are refused")
    if request.get_data(cache=True).strip() and request.mimetype != "application/json":
        raise JsonOnly()


def init_app(app: Flask) -> None:
    app.before_request(_guard)

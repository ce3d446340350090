"""Where this web app is reached: from configuration, never from a request's Host header.

A Host header is whatever the client sent. A redirect or a link built from it
sends a person (or a cache) wherever an attacker likes: ``GET /ui`` with
``Host: evil.example`` used to answer ``Location: http://evil.example/ui/``.
So:

- every ``Location`` that names this app by the request's own host is
  rewritten onto ``KEEL_PUBLIC_URL`` (else ``KEEL_WEB_URL``, which ``keel up``
  writes), or to a path alone when neither is set;
- absolute links (Flower's) come from ``KEEL_FLOWER_URL``, else the public
  URL's host at ``KEEL_FLOWER_PORT``, else there is no link;
- with ``KEEL_TRUSTED_HOSTS`` set, a request for any other host is refused
  (400 ``untrusted_host``), except the probes, which an orchestrator sends
  to a pod's address.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from flask import Flask, Response, request
from werkzeug.utils import redirect

from tasks.platform.config import get_settings
from web.errors import ApiError

PROBES = frozenset({"/healthz", "/readyz"})


def public_base() -> str | None:
    """The app's public URL without a trailing slash, if configured."""
    settings = get_settings()
    url = settings.public_url or settings.web_url
    return url.rstrip("/") if url else None


def trusted_hosts() -> list[str]:
    return [h.strip().lower() for h in get_settings().trusted_hosts.split(",") if h.strip()]


def host_is_trusted(host: str, trusted: list[str]) -> bool:
    """``host`` (no port) is listed, or falls under a listed ``.domain``."""
    host = host.lower().rstrip(".")
    for entry in trusted:
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False


def _request_hostname() -> str:
    raw = request.environ.get("HTTP_HOST") or request.environ.get("SERVER_NAME", "")
    return urlsplit(f"//{raw}").hostname or ""


def flower_url() -> str | None:
    """Flower's address for the dashboard's link, from configuration only."""
    settings = get_settings()
    if settings.flower_url:
        return settings.flower_url
    base = public_base()
    if base is None:
        return None
    parts = urlsplit(base)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{settings.flower_port}"


def _check_host() -> None:
    trusted = trusted_hosts()
    if not trusted or request.path in PROBES:
        return
    if not host_is_trusted(_request_hostname(), trusted):
        raise ApiError(400, "this host is not served here", code="untrusted_host")


def _location(response: Response) -> Response:
    """A ``Location`` on this request's own host is put on the public URL (or made a path)."""
    location = response.headers.get("Location")
    if not location:
        return response
    parts = urlsplit(location)
    if not parts.netloc:
        return response
    if parts.netloc.lower() != request.environ.get("HTTP_HOST", "").lower():
        return response  # somewhere else by design (none of Keel's redirects are)
    base = public_base()
    if base is None:
        moved = urlunsplit(("", "", parts.path, parts.query, parts.fragment))
    else:
        public = urlsplit(base)
        prefix = public.path.rstrip("/")
        path = parts.path if parts.path.startswith(f"{prefix}/") else prefix + parts.path
        moved = urlunsplit((public.scheme, public.netloc, path, parts.query, parts.fragment))
    response.headers["Location"] = moved
    if 300 <= response.status_code < 400 and response.mimetype == "text/html":
        # Werkzeug's redirect page names the target too: the same page, for the new one
        # (a routing redirect's page arrives as an iterator: replaced whole, it is small)
        response.set_data(redirect(moved, response.status_code).get_data())
    return response


def init_app(app: Flask) -> None:
    app.before_request(_check_host)
    app.after_request(_location)

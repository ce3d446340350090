"""Flower as Keel runs it: ``python -m keel.flower [FLOWER OPTIONS]``.

That is ``celery -A keel flower [FLOWER OPTIONS]`` (``keel up``'s Flower, compose's; the
app ``KEEL_CELERY_APP`` names, if it names one),
except that Flower's ``/metrics`` and ``/healthcheck`` want the credentials its pages
want. Flower 2 serves those two to anyone by design, and its metrics name every task
type, worker and pool process of every tenant. Here they answer only the basic auth
(``FLOWER_BASIC_AUTH``) or the OAuth sign-in (``--auth``) that Flower's pages and API
take, and with neither configured they are 401, as Flower's API is.

``python -m keel.flower probe URL`` is the health probe that goes with it (compose's
health check): it reads ``URL`` (Flower's ``/healthcheck``) with the first credential
of ``FLOWER_BASIC_AUTH`` from its environment, and exits 0 on ``200 OK``, else 1 with one
line on stderr saying what answered. Behind OAuth (``--auth``), where a probe has no
sign-in, Flower sending it to its sign-in page (``/login``) counts as up.

Flower is a system-wide admin tool: whoever has its password sees and controls every
tenant's tasks and the workers (docs/dashboard.md#flower). It comes with the ``[flower]``
extra (``pip install 'keel-jobs[flower]'``); without it this says so in one line.
"""

from __future__ import annotations

import base64
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from functools import wraps
from typing import Any

# Flower's handlers (flower.views.monitor) that Flower itself leaves open.
GUARDED = ("Metrics", "Healthcheck")
PROBE_TIMEOUT_S = 3.0


def guard() -> None:
    """Put Flower's ``/metrics`` and ``/healthcheck`` behind the auth of its other pages.

    The handler classes are changed in place, before Flower builds its application from
    ``flower.urls``; a Flower without them is refused rather than served unguarded."""
    from flower.views import monitor

    for name in GUARDED:
        handler = getattr(monitor, name, None)
        if handler is None:
            raise RuntimeError(f"this Flower has no {name} handler to put behind its auth")
        if not getattr(handler.get, "keel_guarded", False):
            handler.get = _authenticated(handler.get)


def _authenticated(get: Callable[..., Any]) -> Callable[..., Any]:
    from tornado import web

    @wraps(get)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        options = self.application.options
        if not (options.basic_auth or options.auth) and not self.unauthenticated_api:
            # As Flower's API without credentials configured (FLOWER_UNAUTHENTICATED_API)
            raise web.HTTPError(401, "Flower runs without credentials")
        return get(self, *args, **kwargs)

    # Flower's own rule for its pages: a wrong basic auth is 401 (``get_current_user``), an
    # OAuth user not signed in is sent to its login page.
    guarded = web.authenticated(checked)
    guarded.keel_guarded = True  # type: ignore[attr-defined]
    return guarded


def run(args: list[str]) -> None:
    """``celery -A keel flower *args`` (or ``KEEL_CELERY_APP``'s app), guarded; returns when
    Flower stops."""
    guard()
    from celery.bin.celery import celery
    from celery.bin.celery import main as celery_main
    from flower.command import flower

    celery.add_command(flower)  # as ``python -m flower`` does, whatever the entry points say
    # "flower" in argv also tells Keel's logging this process's role (tasks.assembly)
    from tasks.platform.config import get_settings

    sys.argv = [sys.argv[0], "-A", get_settings().celery_app or "keel", "flower", *args]
    celery_main()


def _credential() -> str | None:
    given = os.environ.get("FLOWER_BASIC_AUTH", "")
    first = given.split(",")[0].strip()
    return first or None


class _Unfollowed(urllib.request.HTTPRedirectHandler):
    """A redirect is the probe's answer, not a page to go to."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _to_sign_in(location: str | None) -> bool:
    """Whether a redirect goes to Flower's sign-in page (OAuth: ``/login?next=...``)."""
    path = urllib.parse.urlsplit(location or "").path
    return path.rstrip("/").endswith("/login")


def probe(url: str) -> int:
    """0 if Flower at ``url`` answers 200 with the credential of ``FLOWER_BASIC_AUTH`` (or,
    behind OAuth, sends the probe to its sign-in page)."""
    request = urllib.request.Request(url)
    credential = _credential()
    if credential is not None:
        encoded = base64.b64encode(credential.encode()).decode()
        request.add_header("Authorization", f"Basic {encoded}")
    opener = urllib.request.build_opener(_Unfollowed)
    try:
        with opener.open(request, timeout=PROBE_TIMEOUT_S) as response:
            if response.status == 200:
                return 0
            problem = f"answered {response.status}"
    except urllib.error.HTTPError as exc:
        if exc.code in (301, 302, 303, 307, 308) and _to_sign_in(exc.headers.get("Location")):
            return 0  # up, behind its OAuth sign-in
        problem = f"answered {exc.code}"
        if exc.code == 401:
            problem += " (FLOWER_BASIC_AUTH unset or not Flower's)"
    except (OSError, ValueError) as exc:
        problem = f"did not answer: {type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    print(f"keel: Flower's health check at {url} {problem}", file=sys.stderr)
    return 1


USAGE = (
    "usage: python -m keel.flower [FLOWER OPTIONS]   (celery -A keel flower, guarded)\n"
    "       python -m keel.flower probe URL          (Flower's /healthcheck, with its auth)"
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["probe"]:
        if len(args) != 2:
            print(USAGE, file=sys.stderr)
            return 2
        return probe(args[1])
    from keel import extras

    if extras.missing(extras.FLOWER):  # one line, not a traceback
        print(f"keel: Flower is not installed: {extras.install('flower')}", file=sys.stderr)
        return 1
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

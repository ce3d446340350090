"""Signing in with a ``keel ui-link`` URL, and out again.

A link signs in silently only where nobody else can have sent the browser:
the browser holds no session and the link was typed or pasted (or followed
from one of the dashboard's own pages) — ``Sec-Fetch-Site: none`` or
``same-origin``; a browser without Fetch Metadata counts as that when it
sent no foreign ``Origin``/``Referer``. Otherwise the link is not spent and
a page asks first (login CSRF: another site redirecting an operator's
browser to the attacker's unused link must not switch the operator's
session):

- arriving from another site, the page names the identity the link is for
  and offers a **Continue** link back to itself; a cross-site navigation
  carries no ``SameSite=Strict`` cookie, so the page sets none either and
  leaves the browser's session exactly as it was;
- a browser already signed in sees who it is and who the link is for, and
  switches only with **Sign in as …**, a POST with its session's CSRF token;
  that ends the earlier session on the server.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from flask import g, redirect, render_template, request, url_for

from web.ui import bp
from web.ui.session import (
    current_or_none,
    read_link,
    redeem_link,
    sign_in,
    sign_out,
    signed_in,
)


@bp.get("/")
def home() -> Any:
    return redirect(url_for("ui.jobs"))


def _same_origin(url: str) -> bool:
    here, there = urlsplit(request.host_url), urlsplit(url)
    return (here.scheme, here.netloc.lower()) == (there.scheme, there.netloc.lower())


def from_elsewhere() -> bool:
    """Whether this navigation came from another site (or a page of another origin)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site not in ("none", "same-origin")
    for header in ("Origin", "Referer"):  # a browser without Fetch Metadata
        value = request.headers.get(header)
        if value:
            return not _same_origin(value)
    return False  # typed or pasted (or a client that is not a browser)


@bp.get("/login/<token>")
def login(token: str) -> Any:
    """Spend a one-time link and start a session, then the jobs page (303: a plain GET) — or,
    if someone else may have sent the browser here, ask first (the link is not spent)."""
    holder = current_or_none()
    elsewhere = from_elsewhere()
    if holder is None and not elsewhere:
        sign_in(redeem_link(token))
        return redirect(url_for("ui.jobs"), 303)
    wanted = read_link(token)  # valid, unexpired and unused, or the sign-in page says why
    g.principal = holder
    return render_template(
        "ui/signin_confirm.html", wanted=wanted, holder=holder, elsewhere=elsewhere
    )


@bp.post("/login/<token>")
def confirm_login(token: str) -> Any:
    """The person said yes (``Sign in as …``, with the CSRF token): switch sessions."""
    principal = redeem_link(token)
    sign_out()  # the earlier session ends on the server, not only in this browser
    sign_in(principal)
    return redirect(url_for("ui.jobs"), 303)


@bp.get("/signin")
def signin() -> Any:
    """How to get in: ``keel ui-link`` (and who is signed in, if anyone)."""
    g.principal = current_or_none()
    return render_template("ui/signin.html", status=200, message=None)


@bp.post("/logout")
@signed_in(reach="reads")  # a platform session signs out too
def logout() -> Any:
    """End this session (every copy of its cookie); ``everywhere``: all of the user's."""
    from web.ui.session import sign_out_everywhere

    if request.form.get("everywhere"):
        sign_out_everywhere(g.principal.tenant_id, g.principal.user_id)
    sign_out()
    return redirect(url_for("ui.signin"), 303)

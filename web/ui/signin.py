"""Signing in with a ``keel ui-link`` URL, and out again."""

from __future__ import annotations

from typing import Any

from flask import g, redirect, render_template, url_for

from web.ui import bp
from web.ui.session import SignedOut, current, redeem_link, sign_in, sign_out


@bp.get("/")
def home() -> Any:
    return redirect(url_for("ui.jobs"))


@bp.get("/login/<token>")
def login(token: str) -> Any:
    """Spend a one-time link and start a session; then the jobs page (303: a plain GET)."""
    sign_in(redeem_link(token))
    return redirect(url_for("ui.jobs"), 303)


@bp.get("/signin")
def signin() -> Any:
    """How to get in: ``keel ui-link`` (and who is signed in, if anyone)."""
    try:
        g.principal = current()
    except SignedOut:
        g.principal = None
    return render_template("ui/signin.html", status=200, message=None)


@bp.post("/logout")
def logout() -> Any:
    sign_out()
    return redirect(url_for("ui.signin"), 303)

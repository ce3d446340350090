"""Campaigns: chunks, generations, the report, the stalled flag, and the four invariants.

A finished campaign's page runs ``keel campaign verify``'s checks
(``tasks.notifications.verify``) against the provider's ledger and shows each
invariant as PASS or FAIL with its figures; an unfinished one is checked on
request (its "sent once" and "reported once" cannot pass yet). Resume is the
API's operator action (``resume_for``).
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from flask import g, render_template, request, url_for

from tasks.jobs.model.errors import KeelError
from tasks.notifications import campaigns
from tasks.notifications.verify import verify
from tasks.platform import catalog
from web.auth import OPERATOR
from web.campaigns import campaign_for, resume_for
from web.errors import ApiError
from web.ui import bp
from web.ui.forms import act
from web.ui.session import signed_in

log = logging.getLogger(__name__)
LISTED = 50
PAGES = ("ui.campaigns_page", "ui.campaign", "ui.resume_campaign")


@bp.before_request
def _app_on() -> None:
    """With the notifications app off (``KEEL_BUILTIN_JOBS``), these pages do not exist."""
    if request.endpoint in PAGES and not catalog.enabled("notifications"):
        raise ApiError(404, "not found", code="not_found")


@bp.get("/campaigns")
@signed_in()
def campaigns_page() -> Any:
    principal = g.principal
    found = campaigns.list_owned(principal.owner, tenant_wide=principal.operator, limit=LISTED)
    return render_template("ui/campaigns.html", campaigns=[campaigns.describe(c) for c in found])


def _checks(campaign_id: str) -> tuple[list[Any] | None, str | None]:
    """The verifier's checks, or why they could not be made (the provider did not answer)."""
    try:
        return verify(campaign_id), None
    except (requests.RequestException, KeelError, KeyError, ValueError) as exc:
        log.warning("campaign %s: verifier unavailable: %s", campaign_id, exc)
        return None, f"the provider's ledger could not be read ({type(exc).__name__})"


@bp.get("/campaigns/<campaign_id>")
@signed_in()
def campaign(campaign_id: str) -> Any:
    status = campaigns.describe(campaign_for(g.principal, campaign_id))
    checks, problem = None, None
    if status["state"] == "completed" or request.args.get("verify") == "1":
        checks, problem = _checks(campaign_id)
    return render_template("ui/campaign.html", campaign=status, checks=checks, problem=problem)


@bp.post("/campaigns/<campaign_id>/resume")
@signed_in(OPERATOR)
def resume_campaign(campaign_id: str) -> Any:
    return act(
        url_for("ui.campaign", campaign_id=campaign_id),
        lambda: resume_for(g.principal, campaign_id),
        "Resumed: unfinished chunks and sends were dispatched again.",
    )

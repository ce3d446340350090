"""Bulk actions from the jobs page (operators): count first, confirm, then follow progress.

The jobs page's filter (queue, state, name) and the chosen action go to ``/ui/bulk/confirm``,
which shows how many of the tenant's jobs the action would touch (the API's ``dryRun``);
confirming there starts it (``POST /ui/bulk``, the API's ``POST /api/v1/bulk-actions``)
and shows its page, which follows its progress. Refusals come back as the API's messages.
"""

from __future__ import annotations

from typing import Any

from flask import g, redirect, render_template, request, url_for

from tasks.jobs.upkeep import bulk_actions
from web.api import check_payload, validate
from web.auth import OPERATOR
from web.bulk import BulkRequest, asked_by
from web.ui import bp
from web.ui.forms import act
from web.ui.session import signed_in

FILTER_FIELDS = ("queue", "state", "name")


def _request(*, dry_run: bool) -> BulkRequest:
    form = request.form
    chosen: dict[str, Any] = {k: form[k] for k in ("queue", "name") if form.get(k)}
    if form.get("state"):
        chosen["states"] = [form["state"]]
    body = {
        "action": form.get("action", ""),
        "filter": chosen,
        "reason": form.get("reason", ""),
        "dryRun": dry_run,
    }
    checked = validate(BulkRequest, check_payload(body))
    assert isinstance(checked, BulkRequest)
    return checked


@bp.post("/bulk/confirm")
@signed_in(OPERATOR)
def confirm_bulk() -> Any:
    """How many jobs the action would touch, and a button to do it."""
    body = _request(dry_run=True)
    matched = bulk_actions.preview(asked_by(g.principal, body))
    kept = (*FILTER_FIELDS, "action", "reason")
    given = {key: request.form[key] for key in kept if request.form.get(key)}
    filters: dict[str, Any] = {k: v for k, v in given.items() if k in FILTER_FIELDS}
    back = url_for("ui.jobs", **filters)
    return render_template(
        "ui/bulk_confirm.html", body=body, matched=matched, given=given, back=back
    )


@bp.post("/bulk")
@signed_in(OPERATOR)
def start_bulk() -> Any:
    body = _request(dry_run=False)
    started: list[str] = []

    def start() -> None:
        started.append(bulk_actions.start(asked_by(g.principal, body)).id)

    response = act(url_for("ui.jobs"), start, "Started: the workers act on the jobs in batches.")
    if started:
        return redirect(url_for("ui.bulk_page", bulk_id=started[0]), 303)
    return response


@bp.get("/bulk/<bulk_id>")
@signed_in(OPERATOR)
def bulk_page(bulk_id: str) -> Any:
    row = bulk_actions.view(bulk_id, g.principal.tenant_id)
    return render_template("ui/bulk.html", bulk=bulk_actions.describe(row))

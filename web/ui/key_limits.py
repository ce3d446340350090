"""Key limits (the platform role): every job type's declared key limits and the overrides
of them in force, with who set each, when and why, the newest changes, and the forms that
set and clear an override (``web.ui.limit_forms``).

An override names one tenant's keys or any tenant's (``tasks.jobs.run.live_key_limits``),
so this page is the platform role's alone (``web.ui.platform``): a tenant's session is 403
and no tenant's page shows an override. Overrides are changed in the system scope only:
``keel limits keys``, ``PUT /api/v1/system/key-limits/<name>`` with the metrics token, or
this page's forms.
"""

from __future__ import annotations

from typing import Any

from flask import render_template

from tasks.jobs.run import live_key_limits
from web.auth import OPERATOR
from web.ui import bp
from web.ui.session import signed_in

CHANGES_SHOWN = 20


# The role its API twin requires (``GET /api/v1/system/key-limits`` is 403 to every tenant's
# token); ``reach="only"`` then admits platform sessions alone, a tenant operator's not.
@bp.get("/key-limits")
@signed_in(OPERATOR, reach="only")
def key_limits_page() -> Any:
    return key_limits_shown()


def key_limits_shown(status: int = 200, **more: Any) -> Any:
    """The page (``more``: a refused form's values and errors, ``web.ui.limit_forms``)."""
    job_types = [live_key_limits.to_json(limits) for limits in live_key_limits.shown()]
    page = render_template(
        "ui/key_limits.html",
        job_types=job_types,
        declaring=[t["name"] for t in job_types if t["declared"]],
        changes=[
            live_key_limits.change_json(change)
            for change in live_key_limits.history(limit=CHANGES_SHOWN)
        ],
        any_tenant=live_key_limits.ANY_TENANT,
        **more,
    )
    return page, status

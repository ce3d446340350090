"""The platform role: the people who run Keel read every tenant's pages, change the limits
shared by every tenant, and each view is audited.

A platform session comes only from ``keel ui-link --platform`` (a link signed with
``KEEL_SECRET_KEY``, ``web.ui.session.issue_platform_link``): a tenant's token, an identity
provider's sign-in or a tenant's link naming a "platform" role is a tenant's session like
any other. What such a session may open is said by each view (``signed_in(reach=...)``):

- ``reads``: the jobs list (every tenant's, with a tenant filter), a job's page, its state
  and live stream, the queues page (counts across tenants) — the same views as a tenant's,
  scoped to every tenant instead of one (``web.job_query.visible_to``);
- ``only``: the key limit overrides of every job type (``web.ui.key_limits``);
- ``acts``: the forms that set and clear a queue's limits and a job type's key limit
  overrides (``web.ui.limit_forms``): system-wide settings, the API's with the metrics token
  only, so the platform role's alone (a tenant's session is 403), each change audited with
  its reason as the API's and the CLI's are (``ui:<user>``);
- ``refused`` (every other view, and every other form but signing out): 403. On a tenant's
  jobs the role reads and does not act (retry, cancel, pause and the rest stay the tenant's
  operators' and the CLI's).

Every view it opens (and every form it sends) writes a row of ``platform_views`` first (who,
which view, the path with its query, when: ``keel audit views``); while that row cannot be
written, the page is not shown.
"""

from __future__ import annotations

import re
from typing import Literal

from flask import request

from tasks.jobs.observe import platform_views
from web import auth
from web.auth import Principal
from web.errors import ApiError

Reach = Literal["refused", "reads", "only", "acts"]
PLATFORM_ONLY: tuple[Reach, ...] = ("only", "acts")  # a tenant's session is 403 there
FOR_PLATFORM = "a page of the platform role (keel ui-link --platform), not a tenant's"
READ_ONLY = (
    "the platform role reads every tenant's pages and acts on none of a tenant's objects "
    "(it changes queue and key limits only): a tenant's operator or the keel command acts"
)
MAX_PATH = 2000
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def admit(principal: Principal, reach: Reach) -> None:
    """Let ``principal`` in to a view of ``reach`` (a platform session, or a tenant's on a
    platform-only page or form); 403 otherwise, before any object is looked up."""
    auth.admit(principal)
    if not principal.platform:
        raise ApiError(403, FOR_PLATFORM)
    if reach == "refused":
        raise ApiError(403, READ_ONLY)


def audit(principal: Principal) -> None:
    """Keep that ``principal`` opened this view, before it is made."""
    platform_views.record(principal.user_id, request.endpoint or "", shown_path())


def shown_path() -> str:
    """The request's path and query as sent, its control characters %-escaped, cut short."""
    query = request.query_string.decode("latin-1")
    path = request.path.encode("utf-8", "backslashreplace").decode("utf-8")
    path += f"?{query}" if query else ""
    return _UNPRINTABLE.sub(lambda m: f"%{ord(m.group(0)):02X}", path)[:MAX_PATH]

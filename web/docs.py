"""``/api/v1/docs``: the API's OpenAPI description, rendered by Swagger UI.

Swagger UI's files come from the ``flask-swagger-ui`` package (its ``dist``
folder: Swagger UI 5, which reads OpenAPI 3.1) and are served by this app —
no CDN. The page's own script only points Swagger UI at
``/api/v1/openapi.json``; "Authorize" takes a token from ``keel token``.
"""

from __future__ import annotations

from pathlib import Path

import flask_swagger_ui
from flask import Blueprint, Response, abort, render_template, send_from_directory

from web.api import operation

bp = Blueprint("docs", __name__, url_prefix="/api/v1/docs", template_folder="ui/templates")
DIST = Path(flask_swagger_ui.__file__).parent / "dist"
ASSETS = frozenset(
    {"swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "index.css"}
)
# Swagger UI sets style attributes as it renders; scripts still come from this app only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"
)


@operation(
    bp,
    "",
    "GET",
    summary="This API's description as a page (Swagger UI)",
    responses={200: None},
    authenticated=False,
    produces="text/html",
)
def docs():
    response = Response(render_template("ui/docs.html"), mimetype="text/html")
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


@bp.get("/assets/<name>")
def asset(name: str):
    if name not in ASSETS:
        abort(404)
    return send_from_directory(DIST, name, max_age=3600)

"""Keel's HTTP API: a Flask app factory.

Served by ``flask --app web run`` in development and ``gunicorn 'web:create_app()'``.
"""

from __future__ import annotations

from typing import Any

from flask import Flask

from tasks.config import get_settings

MAX_BODY_BYTES = 1024 * 1024


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    settings = get_settings()
    app.config.from_mapping(
        SECRET_KEY=settings.secret_key,
        KEEL_FAULT_INJECTION=settings.fault_injection,
        KEEL_TOKEN_MAX_TTL_S=settings.token_max_ttl_s,
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
        JSON_SORT_KEYS=False,
    )
    if test_config:
        app.config.update(test_config)

    # Imported here, not at the top: ``web.cli`` lives in this package and must stay fast.
    from tasks import quotas
    from web import campaigns, errors, events, ratelimit, reports, schedulers, system
    from web.auth import check_secret

    check_secret(app.config["SECRET_KEY"])  # refuse to start with a missing or weak key
    quotas.current()  # and with a malformed KEEL_TENANT_QUOTAS

    errors.init_app(app)
    ratelimit.init_app(app)
    app.register_blueprint(system.bp)
    app.register_blueprint(reports.bp)
    app.register_blueprint(events.bp)
    app.register_blueprint(schedulers.bp)
    app.register_blueprint(campaigns.bp)
    return app

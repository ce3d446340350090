"""Keel's HTTP API: a Flask app factory.

Served by ``flask --app web run`` in development and, in production, by
``gunicorn -c python:web.gunicorn_conf 'web:create_app()'`` (see that module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from tasks.platform.config import get_settings

if TYPE_CHECKING:
    from flask import Flask
    from flask.json.provider import JSONProvider

MAX_BODY_BYTES = 1024 * 1024


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    from flask import Flask  # here: ``keel token`` imports this package and must stay fast

    app = Flask(__name__)
    app.json = iso_json(app)
    settings = get_settings()
    app.config.from_mapping(
        SECRET_KEY=settings.secret_key,
        # Earlier keys, still accepted: tokens, sessions and sign-in links they signed live on
        SECRET_KEY_FALLBACKS=settings.secret_fallbacks,
        KEEL_FAULT_INJECTION=settings.fault_injection,
        KEEL_TOKEN_MAX_TTL_S=settings.token_max_ttl_s,
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
        JSON_SORT_KEYS=False,
    )
    if test_config:
        app.config.update(test_config)

    # Imported here, not at the top: ``keel.cli`` lives in this package and must stay fast.
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.platform import catalog, db, quotas, tracing
    from web import (
        access,
        bulk,
        docs,
        errors,
        hosts,
        jobs,
        key_limits,
        queue_limits,
        queues,
        ratelimit,
        schedulers,
        system,
        tenant_events,
        ui,
        webhooks,
    )
    from web.tokens import check_secret

    check_secret(app.config["SECRET_KEY"])  # refuse to start with a missing or weak key
    for earlier in app.config["SECRET_KEY_FALLBACKS"]:
        check_secret(earlier, "KEEL_SECRET_KEY_FALLBACKS")
    quotas.current()  # and with a malformed KEEL_TENANT_QUOTAS
    load_job_modules()  # every job type, Keel's and KEEL_JOB_MODULES', known to the API

    app.wsgi_app = StoreDeadline(app.wsgi_app, db.request_scope)  # type: ignore[method-assign]
    tracing.configure("web")  # OTEL_TRACES_EXPORTER: off unless set (each gunicorn worker)
    tracing.instrument_flask(app)  # the request span, around everything below
    access.init_app(app)  # the request id and the access log, before any other hook
    errors.init_app(app)
    hosts.init_app(app)  # links and redirects from configuration, never the Host header
    ratelimit.init_app(app)
    app.register_blueprint(system.bp)
    # A built-in app that is off (KEEL_BUILTIN_JOBS) has no endpoints: they answer 404.
    # Imported only then: importing an app's module declares its job types.
    if catalog.enabled("reports"):
        from web import events, reports

        app.register_blueprint(reports.bp)
        app.register_blueprint(events.bp)
    app.register_blueprint(schedulers.bp)
    if catalog.enabled("notifications"):
        from web import campaigns

        app.register_blueprint(campaigns.bp)
    app.register_blueprint(queues.bp)
    app.register_blueprint(queue_limits.bp)
    app.register_blueprint(key_limits.bp)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(tenant_events.bp)
    app.register_blueprint(bulk.bp)
    app.register_blueprint(webhooks.bp)
    app.register_blueprint(docs.bp)
    ui.init_app(app)
    return app


def iso_json(app: Flask) -> JSONProvider:
    """Flask's JSON, with every date written as the API writes its timestamps (ISO 8601).

    Flask's own provider writes a ``datetime`` as an RFC 1123 date (an HTTP header's
    format): a view that hands one to ``jsonify`` as it is would show a second format
    beside ``createdAt``'s. Made with the app, not at import: importing ``web`` (``keel
    token`` does) must not import Flask.
    """
    from flask.json.provider import DefaultJSONProvider

    from tasks.jobs.observe.queries import iso

    class IsoJSONProvider(DefaultJSONProvider):
        @staticmethod
        def default(o: Any) -> Any:
            if isinstance(o, datetime):
                return iso(o)
            if isinstance(o, date):
                return o.isoformat()
            return DefaultJSONProvider.default(o)

    return IsoJSONProvider(app)


class StoreDeadline:
    """WSGI middleware: a request's database work shares one deadline (``tasks.platform.db``).

    It covers the view, not the body a streamed response yields afterwards
    (an event stream reads Redis only, for minutes).
    """

    def __init__(self, wsgi_app: Callable, scope: Callable[[], AbstractContextManager]) -> None:
        self.wsgi_app = wsgi_app
        self.scope = scope

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        with self.scope():
            return self.wsgi_app(environ, start_response)

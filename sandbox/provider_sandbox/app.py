"""The sandbox's Flask application factory."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from provider_sandbox import config, errors, guard
from provider_sandbox.admin import ADMIN_KEY_CONFIG, admin, ledger_bp
from provider_sandbox.groups import bp as groups_bp
from provider_sandbox.state import EXTENSION, Sandbox

MAX_BODY_BYTES = 16 * 1024 * 1024  # 1,000 messages with long texts fit


def create_app(
    home: Path | str | None = None, *, capacity: int | None = None, admin_key: str | None = None
) -> Flask:
    """The sandbox over the SQLite data in ``home`` (default ``config.home()``).

    ``admin_key`` (default ``KEEL_SANDBOX_ADMIN_KEY``) opens ``/admin`` and
    ``/v1/ledger``; with none they answer 401.

    Serve it from one process (``gunicorn -w 1 --threads 8``): fault settings
    and the rate limiter live in the process.
    """
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    if admin_key is None:
        admin_key = config.admin_key()
    app.config[ADMIN_KEY_CONFIG] = admin_key
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION] = Sandbox.open(Path(home or config.home()), capacity)
    errors.init_app(app)
    guard.init_app(app)  # no browser page drives it: Host, Origin, JSON bodies
    app.register_blueprint(groups_bp)
    app.register_blueprint(admin)
    app.register_blueprint(ledger_bp)
    app.add_url_rule("/health", "health", lambda: {"status": "ok"})
    return app

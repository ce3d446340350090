"""Schema migrations: Alembic ``upgrade head`` from wherever Keel is installed.

The Alembic environment and versions live in the repository's ``migrations/``
folder and install as the package ``tasks.migrations`` (setup.py maps the one to
the other; ``script.py.mako`` and ``versions/`` ship as its package data). They
are found here through importlib.resources, so ``keel db upgrade`` works the same
from an editable install of a checkout or from a wheel. ``alembic.ini`` at the
repository root serves the plain ``alembic`` command in a checkout; this path
needs nothing from it but the script location, which it sets itself.
"""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config

MIGRATIONS_PACKAGE = "tasks.migrations"  # the repository's migrations/ (setup.py)


def script_location() -> str:
    """The migrations' folder (wheels install unzipped: a real folder Alembic can list)."""
    return str(resources.files(MIGRATIONS_PACKAGE))


def alembic_config() -> Config:
    """Alembic's configuration for Keel's schema; the URL comes from Keel's settings (env.py)."""
    config = Config()
    config.set_main_option("script_location", script_location())
    config.set_main_option("path_separator", "os")
    # The caller (keel, the supervisor, a test) owns logging; env.py must not reset it.
    config.attributes["configure_logger"] = False
    return config


def migrate() -> None:
    """Alembic upgrade head against the configured database."""
    command.upgrade(alembic_config(), "head")

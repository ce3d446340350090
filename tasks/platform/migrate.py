"""Schema migrations: Alembic ``upgrade head`` from wherever Keel is installed.

The Alembic environment and versions are the top-level ``migrations``
package, shipped in the wheel as package data and found here through
importlib.resources, so ``keel db upgrade`` works the same from a checkout,
an editable install or a wheel. ``alembic.ini`` at the repository root
serves the plain ``alembic`` command in a checkout; this path needs nothing
from it but the script location, which it sets itself.
"""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config

MIGRATIONS_PACKAGE = "migrations"


def script_location() -> str:
    """The ``migrations`` folder (wheels install unzipped: a real folder Alembic can list)."""
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

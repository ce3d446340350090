"""The ``keel`` command."""

from __future__ import annotations

import sys

import click

from tasks.config import get_settings


@click.group()
def main() -> None:
    """Keel: Celery jobs with BullMQ's semantics."""


@main.command()
def up() -> None:
    """Run the whole stack (embedded Postgres and Redis unless URLs are configured)."""
    from web.stack import Stack

    sys.exit(Stack().run())


@main.command()
@click.option("--tenant", required=True)
@click.option("--user", required=True)
@click.option("--role", "roles", multiple=True, help="repeat for several roles")
@click.option("--ttl", default=3600, show_default=True, type=click.IntRange(1), help="seconds")
def token(tenant: str, user: str, roles: tuple[str, ...], ttl: int) -> None:
    """Print a signed bearer token."""
    from web.auth import issue_token

    secret = get_settings().secret_key
    if not secret:
        raise click.ClickException("KEEL_SECRET_KEY is not set and no stack is running")
    click.echo(issue_token(secret, tenant, user, list(roles), ttl))


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Alembic upgrade head."""
    from web.stack import migrate

    migrate()
    click.echo("database at head")

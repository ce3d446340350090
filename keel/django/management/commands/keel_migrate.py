"""``python manage.py keel_migrate``: Keel's tables up to date, in Keel's database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Bring Keel's tables up to date (Alembic's upgrade head, in Keel's database)."

    def handle(self, *args: Any, **options: Any) -> None:
        from tasks.platform.config import get_settings, reload_settings
        from tasks.platform.migrate import migrate

        reload_settings()  # Django's settings are loaded by now
        migrate()
        self.stdout.write(
            f"Keel's tables are up to date in {get_settings().sqlalchemy_url.rsplit('/', 1)[-1]}"
        )

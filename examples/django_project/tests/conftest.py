import pytest
from django.core.management import call_command


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker):
    """The project's own database, as configured (Keel's tables are in it too), migrated:
    the worker reads the same database, so no test database is made."""
    with django_db_blocker.unblock():
        call_command("migrate", verbosity=0)
        call_command("keel_migrate")

"""A Django ``DATABASES`` entry as Keel's database URL (``keel.django``): what psycopg gets."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from tasks.platform.config import django_database_url

POSTGRES = "django.db.backends.postgresql"


def connect_args(url: str) -> dict[str, Any]:
    """What psycopg is given to connect with, from ``url`` (Keel's driver for it)."""
    parsed = make_url(url).set(drivername="postgresql+psycopg")
    return dict(PGDialect_psycopg().create_connect_args(parsed)[1])


def test_a_unix_socket_host_goes_in_the_query():
    database = {"ENGINE": POSTGRES, "NAME": "shop", "USER": "keel", "HOST": "/var/run/postgresql"}
    url = django_database_url(database)
    assert url == "postgresql://keel@/shop?host=%2Fvar%2Frun%2Fpostgresql"
    assert connect_args(url) == {"dbname": "shop", "user": "keel", "host": "/var/run/postgresql"}


def test_a_unix_socket_host_keeps_its_port():
    database = {"ENGINE": POSTGRES, "NAME": "shop", "HOST": "/tmp/pg sock", "PORT": 5433}
    url = django_database_url(database)
    assert url == "postgresql:///shop?host=%2Ftmp%2Fpg+sock&port=5433"
    assert connect_args(url) == {"dbname": "shop", "host": "/tmp/pg sock", "port": "5433"}


def test_an_empty_host_is_libpqs_default_as_for_django():
    database = {"ENGINE": POSTGRES, "NAME": "shop", "USER": "keel", "HOST": "", "PORT": ""}
    url = django_database_url(database)
    assert url == "postgresql://keel@/shop"
    assert connect_args(url) == {"dbname": "shop", "user": "keel"}  # no host: libpq's own


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("db.internal", "5433", "postgresql://keel@db.internal:5433/shop"),
        ("db.internal", "", "postgresql://keel@db.internal/shop"),
        ("", 5433, "postgresql://keel@:5433/shop"),
        ("::1", 5433, "postgresql://keel@[::1]:5433/shop"),
    ],
)
def test_a_tcp_host_and_its_port(host, port, expected):
    database = {"ENGINE": POSTGRES, "NAME": "shop", "USER": "keel", "HOST": host, "PORT": port}
    url = django_database_url(database)
    assert url == expected
    args = connect_args(url)
    assert (args.get("host"), args.get("port")) == (host or None, int(port) if port else None)


def test_a_password_with_special_characters_comes_through_unchanged():
    password = "p@ss:w/rd?#%&= é"
    database = {
        "ENGINE": POSTGRES,
        "NAME": "shop",
        "USER": "keel@corp",
        "PASSWORD": password,
        "HOST": "/var/run/postgresql",
    }
    url = django_database_url(database)
    assert password not in url
    args = connect_args(url)
    assert (args["user"], args["password"], args["host"]) == (
        "keel@corp",
        password,
        "/var/run/postgresql",
    )


def test_another_engine_gives_no_url():
    assert django_database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "app.db"}) is None

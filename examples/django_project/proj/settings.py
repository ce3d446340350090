"""The example project's settings: one PostgreSQL database, Django's and Keel's.

``DATABASE_URL`` (or Keel's own ``KEEL_DATABASE_URL``) names it; Keel finds its database
in ``DATABASES["default"]`` (``keel.django``), so jobs are recorded on Django's connection.
"""

import os
from urllib.parse import parse_qs, unquote, urlsplit

_url = urlsplit(os.environ.get("DATABASE_URL") or os.environ["KEEL_DATABASE_URL"])
_query = parse_qs(_url.query)  # a Unix socket's folder may come as ?host=

SECRET_KEY = "example-only"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "proj.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "keel.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or _query.get("host", [""])[0],
        "PORT": _url.port or _query.get("port", [""])[0],
    }
}

# Celery's settings, under its Django namespace; the broker is Keel's (KEEL_REDIS_URL).
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_ROUTES = {"shop.tasks.confirm": {"queue": "orders"}}

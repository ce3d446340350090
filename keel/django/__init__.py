"""Keel in a Django project: add ``"keel.django"`` to ``INSTALLED_APPS``.

- **Settings**: Keel reads ``KEEL_*`` names from your settings module (the same names as
  its environment variables, which still win), in every process where
  ``DJANGO_SETTINGS_MODULE`` is set; with no ``KEEL_DATABASE_URL``, Keel's tables go in
  your default database when that is PostgreSQL (so ``in_transaction`` records jobs on
  Django's own connection).
- **Your Celery app**: ``proj/celery.py`` as Celery's Django guide writes it, with
  ``keel.install(app)`` after ``config_from_object``; ``celery -A proj worker|beat`` then
  run Keel's semantics, and Celery calls ``django.setup()`` before your tasks load.
  Keel's API and ``keel`` command load it from ``KEEL_CELERY_APP=proj.celery:app``.
- **Migrations**: ``python manage.py keel_migrate`` brings Keel's own tables up to date
  (Alembic's, beside Django's migrations; run it wherever you run ``migrate``).
- **Jobs in your transaction**: ``with transaction.atomic(), keel.in_transaction(connection)``
  (``from django.db import connection``): a rolled-back block leaves no job and no
  message; a committed one is published from Django's ``on_commit``.
"""

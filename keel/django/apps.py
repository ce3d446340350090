"""Keel as a Django app (``INSTALLED_APPS = [..., "keel.django"]``): it has no models of
its own in Django; it brings the ``keel_migrate`` command."""

from __future__ import annotations

from django.apps import AppConfig


class KeelConfig(AppConfig):
    name = "keel.django"
    label = "keel"
    verbose_name = "Keel"

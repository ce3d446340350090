"""Which page each generator writes (paths from the checkout's root)."""

from __future__ import annotations

from collections.abc import Callable

from docs.gen import http_api, python_api, settings

PAGES: dict[str, Callable[[], str]] = {
    "docs/reference/http-api.md": http_api.page,
    "docs/reference/configuration.md": settings.page,
    "docs/reference/python-api.md": python_api.page,
}

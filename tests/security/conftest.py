"""Shared by the security tier: the served OpenAPI document and the figures each scenario reports.

Every scenario enumerates endpoints from ``GET /api/v1/openapi.json``, so an
endpoint added later is attacked without anyone editing these tests. The
figures (endpoints x tenants checked, tokens rejected, examples sent, 5xx
seen) are printed at the end of the run, next to the pass/fail lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pytest

from tasks.jobs.schedule import schedulers
from web import create_app

OPENAPI = "/api/v1/openapi.json"
HTTP_METHODS = ("get", "put", "post", "delete", "patch")
FIGURES: dict[str, str] = {}


@dataclass(frozen=True)
class DocumentedOperation:
    """One method on one path of the served document."""

    method: str
    path: str
    spec: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.method.upper()} {self.path}"

    @property
    def authenticated(self) -> bool:
        return bool(self.spec.get("security"))

    @property
    def operator_only(self) -> bool:
        return "403" in self.spec.get("responses", {})

    @property
    def path_params(self) -> list[str]:
        return [p["name"] for p in self.spec.get("parameters", []) if p.get("in") == "path"]

    @property
    def body_schema(self) -> str | None:
        """The component name of the JSON body's schema, if the operation takes one."""
        body = self.spec.get("requestBody")
        if not body:
            return None
        return body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]


@lru_cache(maxsize=1)
def served_document() -> dict[str, Any]:
    """The document as a client gets it (needs no database: safe at collection time)."""
    response = create_app({"TESTING": True}).test_client().get(OPENAPI)
    assert response.status_code == 200
    return response.get_json()


def documented_operations(document: dict[str, Any] | None = None) -> list[DocumentedOperation]:
    document = document or served_document()
    return [
        DocumentedOperation(method, path, spec)
        for path, item in document["paths"].items()
        for method, spec in item.items()
        if method in HTTP_METHODS
    ]


def record_figure(name: str, value: str) -> None:
    FIGURES[name] = value


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items) -> None:
    """One node id per fuzzed operation. schemathesis names each operation's test
    ``test_...[METHOD /path]``, but on pytest 9.2 the item's node id leaves the bracket
    out, so every operation of a test shares one id; pytest-xdist (``-n``), which runs
    and reports items by id, then fuzzed one operation and counted the rest as that one
    (``test_fuzz`` and ``test_system_limits_fuzz`` check that every operation was reached).
    The id is made from the name again."""
    from schemathesis.pytest.plugin import SchemathesisFunction

    for item in items:
        if isinstance(item, SchemathesisFunction) and item.nodeid.rpartition("::")[2] != item.name:
            item._id = item.parent.id.child(item.name)


def pytest_terminal_summary(terminalreporter) -> None:  # pragma: no cover - reporting only
    if FIGURES:
        terminalreporter.section("security figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture
def drop_schedulers_of() -> Iterator[list[str]]:
    """Tenants whose schedulers are removed after the test: no beat of the session may fire them."""
    tenants: list[str] = []
    yield tenants
    for tenant in tenants:
        scope = schedulers.Scope(tenant_id=tenant)
        for record in schedulers.list_all(scope):
            schedulers.remove(scope, record.id)

"""The OpenAPI 3.1 document, built from the registered operations."""

from __future__ import annotations

from typing import Any

from flask import current_app
from pydantic import BaseModel

from web.api import OPERATIONS, Operation
from web.schemas import Error

REF = "#/components/schemas/{model}"


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, str]:
    schema = model.model_json_schema(ref_template=REF)
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = definition
    components[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}


IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Sent again with the same key and body, the request answers its first "
    "answer (Idempotent-Replayed: true) instead of running again; per user, for "
    "KEEL_IDEMPOTENCY_TTL_S (24 h)",
    # visible ASCII (a quoted structured-field string is one too)
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
}


def _error(error_ref: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": error_ref}}}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model's fields as OpenAPI parameters (a query value is never ``null``)."""
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    parameters = []
    for name, field in schema["properties"].items():
        variants = [v for v in field.get("anyOf", [field]) if v.get("type") != "null"]
        described = {k: v for k, v in field.items() if k not in ("anyOf", "title")}
        if described.get("default", "") is None:
            del described["default"]
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "schema": {**variants[0], **described} if len(variants) == 1 else field,
            }
        )
    return parameters


def _operation(op: Operation, components: dict[str, Any]) -> dict[str, Any]:
    error_ref = _schema(Error, components)
    responses: dict[str, Any] = {}
    for status, model in op.responses.items():
        if model is None and status < 400:
            content = {op.produces: {"schema": {"type": "string"}}}
        elif model is None:
            content = {"application/json": {"schema": error_ref}}
        else:
            content = {op.produces: {"schema": _schema(model, components)}}
        responses[str(status)] = {"description": str(status), "content": content}
    if not op.open_now:
        responses.setdefault(
            "401", {"description": "401", "content": {"application/json": {"schema": error_ref}}}
        )
        # the per-tenant request rate limit (web.ratelimit), with Retry-After
        responses.setdefault(
            "429", {"description": "429", "content": {"application/json": {"schema": error_ref}}}
        )
        if op.role or not op.tenants:
            responses.setdefault(
                "403",
                {"description": "403", "content": {"application/json": {"schema": error_ref}}},
            )
    if op.body is not None or op.path_params or op.query is not None:  # all validated
        responses.setdefault(
            "400", {"description": "400", "content": {"application/json": {"schema": error_ref}}}
        )
    if op.body is not None:  # past MAX_CONTENT_LENGTH
        responses.setdefault(
            "413", {"description": "413", "content": {"application/json": {"schema": error_ref}}}
        )
    spec: dict[str, Any] = {"summary": op.summary, "responses": responses}
    parameters = [
        {"name": p, "in": "path", "required": True, "schema": op.param_schemas[p]}
        for p in op.path_params
    ]
    if op.query is not None:
        parameters += _query_parameters(op.query)
    if op.idempotent:
        parameters.append(IDEMPOTENCY_KEY)
        responses.setdefault("409", _error(error_ref, "a request with the key still runs"))
        responses.setdefault("422", _error(error_ref, "the key was sent with another request"))
    if parameters:
        spec["parameters"] = parameters
    if op.body is not None:
        spec["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _schema(op.body, components)}},
        }
    spec["security"] = [] if op.open_now else [{"bearer": []}]
    return spec


def document() -> dict[str, Any]:
    """The API as this app serves it: a built-in app turned off is not described."""
    components: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    served = current_app.blueprints
    for op in OPERATIONS:
        if op.blueprint not in served:
            continue
        paths.setdefault(op.path, {})[op.method] = _operation(op, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Keel", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
        },
    }

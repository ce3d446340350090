"""Declaring endpoints once: route, auth, body model and responses.

The same pydantic models validate request bodies and generate the OpenAPI
document, so the description can never drift from what is enforced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from flask import Blueprint, request
from pydantic import BaseModel, ValidationError

from web import auth
from web.errors import ApiError


@dataclass
class Operation:
    """One documented endpoint."""

    method: str
    path: str
    summary: str
    body: type[BaseModel] | None
    responses: dict[int, type[BaseModel] | None]
    auth: bool
    role: str | None
    path_params: list[str] = field(default_factory=list)
    produces: str = "application/json"


OPERATIONS: list[Operation] = []


def _reject_constant(value: str) -> None:
    raise ValueError(f"{value} is not valid JSON")


def parse_json_body() -> Any:
    if request.mimetype != "application/json":
        raise ApiError(400, "Content-Type must be application/json", code="invalid_content_type")
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}", code="malformed_json") from None


def validation_details(error: ValidationError) -> list[dict[str, Any]]:
    return [
        {
            "field": ".".join(str(p) for p in item["loc"]) or "(body)",
            "message": item["msg"],
            "type": item["type"],
        }
        for item in error.errors(include_url=False, include_input=False)
    ]


def validate(model: type[BaseModel], payload: Any) -> BaseModel:
    if not isinstance(payload, dict):
        raise ApiError(400, "the body must be a JSON object", code="validation_failed")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ApiError(
            400,
            "the request body is invalid",
            code="validation_failed",
            details=validation_details(exc),
        ) from None


def _openapi_path(rule: str) -> tuple[str, list[str]]:
    params = re.findall(r"<(?:[^:<>]+:)?([^<>]+)>", rule)
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule), params


def operation(
    blueprint: Blueprint,
    rule: str,
    method: str,
    *,
    summary: str,
    responses: dict[int, type[BaseModel] | None],
    body: type[BaseModel] | None = None,
    authenticated: bool = True,
    role: str | None = None,
    produces: str = "application/json",
) -> Callable:
    """Register a view on ``blueprint`` and in the OpenAPI description.

    The view receives the validated body as ``body=`` when ``body`` is set.
    """

    def register(view: Callable) -> Callable:
        @wraps(view)
        def with_body(*args: Any, **kwargs: Any) -> Any:
            if body is not None:
                kwargs["body"] = validate(body, parse_json_body())
            return view(*args, **kwargs)

        endpoint = auth.require(role)(with_body) if authenticated else with_body
        blueprint.add_url_rule(rule, view.__name__, endpoint, methods=[method])
        prefix = blueprint.url_prefix or ""
        path, params = _openapi_path(prefix + rule)
        OPERATIONS.append(
            Operation(
                method.lower(),
                path,
                summary,
                body,
                responses,
                authenticated,
                role,
                params,
                produces,
            )
        )
        return endpoint

    return register

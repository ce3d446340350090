"""Declaring endpoints once: route, auth, body model and responses.

The same pydantic models validate request bodies and generate the OpenAPI
document, so the description can never drift from what is enforced.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from flask import Blueprint, request
from pydantic import BaseModel, ValidationError
from werkzeug.datastructures import MultiDict

from tasks.platform.ids import CONTROL
from web import auth, idempotency
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
    param_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    query: type[BaseModel] | None = None
    blueprint: str = ""  # documented only where this blueprint is registered
    # Whether the endpoint is open to anyone now (a setting): then documented without auth.
    public_when: Callable[[], bool] | None = None
    # False: a system-wide view, which no tenant's token reads (only ``admits``'s credential).
    tenants: bool = True
    # A creating endpoint that honours an Idempotency-Key header (web.idempotency).
    idempotent: bool = False

    @property
    def open_now(self) -> bool:
        return not self.auth or (self.public_when is not None and self.public_when())


OPERATIONS: list[Operation] = []

# Ids in paths: what the records can hold (String(200)), with no control character nor line
# break (``tasks.platform.ids``: Postgres text cannot hold NUL; C1 controls and U+2028/U+2029 break
# a
# line too) and no "/" (it would be another path). An operation may narrow this with
# ``params=``. A value outside it is refused with 400 before the view runs, so no lookup
# sees it. Every pattern here is checked with ``re.fullmatch``: ``re.match`` with ``$`` also
# takes a final "\n" (pydantic's patterns and the document's ECMA ones anchor ``$`` at the end).
PATH_PARAM_PATTERN = rf"^[^{CONTROL}/]+$"
PATH_PARAM_MAX = 200


def path_param_schema(pattern: str = PATH_PARAM_PATTERN, max_length: int = PATH_PARAM_MAX) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": pattern}


def _reject_constant(value: str) -> None:
    raise ValueError(f"{value} is not valid JSON")


EXACT_INTEGERS = 2**53


def _parse_float(literal: str) -> float | int:
    """``4.0`` and ``1e3`` are integers to JSON Schema, so integer fields must take them too.

    The OpenAPI document says ``"type": "integer"``, which a client may meet with
    ``4.0``; strict models would refuse it. Integral values that a float holds
    exactly become ints; anything else stays a float (and is refused by integer
    fields as before).

    A number no float holds (``1e400``) would read as ``Infinity``, which JSON,
    Postgres and the OpenAPI document all lack: it is malformed input (400).
    """
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal[:40]} is out of the range of a JSON number (a double)")
    if value.is_integer() and abs(value) <= EXACT_INTEGERS:
        return int(value)
    return value


MAX_JSON_DEPTH = 32
UNSTORABLE = "NUL characters and unpaired surrogates are not accepted"


def _unstorable(text: str) -> bool:
    """NUL, or an unpaired surrogate (``"\\ud800"``): neither Postgres nor UTF-8 can hold it."""
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _body_problem(payload: Any) -> tuple[str, str, str] | None:
    """The first ``(field, type, message)`` that makes a parsed body unsafe to go further.

    Iterative on purpose: a body nested a thousand levels deep must be refused,
    not blow the stack (json.dumps, pydantic and this walk all recurse).
    """
    stack: list[tuple[Any, str, int]] = [(payload, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return where or "(body)", "too_deep", f"nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(value, str) and _unstorable(value):
            return where or "(body)", "invalid_character", UNSTORABLE
        items: list[tuple[Any, Any]] = []
        if isinstance(value, list):
            items = list(enumerate(value))
        elif isinstance(value, dict):
            items = list(value.items())
        for key, item in reversed(items):
            inner = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and _unstorable(key):
                return inner, "invalid_character", UNSTORABLE
            stack.append((item, inner, depth + 1))
    return None


def _too_deep() -> ApiError:
    detail = {
        "field": "(body)",
        "type": "too_deep",
        "message": f"nested deeper than {MAX_JSON_DEPTH} levels",
    }
    return ApiError(400, "the request body is invalid", code="validation_failed", details=[detail])


def parse_json_body() -> Any:
    if request.mimetype != "application/json":
        raise ApiError(400, "Content-Type must be application/json", code="invalid_content_type")
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    try:
        payload = json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_parse_float
        )
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}", code="malformed_json") from None
    return check_payload(payload)


def load_json(text: str, field: str) -> Any:
    """A JSON value typed into a form's ``field``, read by the body's rules (else a 400)."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_parse_float)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:
        raise ApiError(
            400,
            f"{field} is not valid JSON: {exc}",
            code="malformed_json",
            details=[{"field": field, "type": "json", "message": str(exc)}],
        ) from None
    return check_payload(value)


def check_payload(payload: Any) -> Any:
    """``payload`` if it is safe to go further (a JSON body, or a form's values): else a 400.

    Checked here, once, rather than failing as a 500 deep in the store.
    """
    problem = _body_problem(payload)
    if problem is not None:
        where, kind, message = problem
        raise ApiError(
            400,
            "the request body is invalid",
            code="validation_failed",
            details=[
                {
                    "field": where.encode("utf-8", "backslashreplace").decode(),
                    "type": kind,
                    "message": message,
                }
            ],
        )
    return payload


def check_path_params(schemas: dict[str, dict[str, Any]], values: dict[str, Any]) -> None:
    """Refuse (400) a path parameter outside its documented schema."""
    for name, schema in schemas.items():
        value = values.get(name)
        if not isinstance(value, str):
            continue
        if not (
            schema["minLength"] <= len(value) <= schema["maxLength"]
            and re.fullmatch(schema["pattern"], value)  # fullmatch: "$" also matches before "\n"
        ):
            raise ApiError(
                400,
                f"invalid path parameter {name}",
                code="validation_failed",
                details=[
                    {
                        "field": name,
                        "type": "path_parameter",
                        "message": f"must match {schema['pattern']} "
                        f"({schema['minLength']}..{schema['maxLength']} chars)",
                    }
                ],
            )


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
        # Strict, in JSON mode, for the whole tree: nested models that are lax on their
        # own (job-layer models such as a scheduler's template) refuse "5" for 5 here
        # too, while ISO-8601 strings still read as datetimes.
        return model.model_validate_json(json.dumps(payload), strict=True)
    except ValidationError as exc:
        raise ApiError(
            400,
            "the request body is invalid",
            code="validation_failed",
            details=validation_details(exc),
        ) from None


def validate_query(model: type[BaseModel], args: MultiDict | None = None) -> BaseModel:
    """The query string (or ``args``) as ``model`` (400 for an unknown, repeated or invalid
    parameter).

    Query values are strings, so the model reads them laxly (``limit=20`` is 20);
    a repeated parameter would be silently cut to its first value, so it is refused.
    """
    args = request.args if args is None else args
    repeated = [name for name, values in args.lists() if len(values) > 1]
    if repeated:
        raise ApiError(
            400,
            "a query parameter is repeated",
            code="validation_failed",
            details=[
                {"field": name, "type": "repeated", "message": "give it once"} for name in repeated
            ],
        )
    try:
        return model.model_validate(args.to_dict())
    except ValidationError as exc:
        raise ApiError(
            400,
            "the query string is invalid",
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
    params: dict[str, str] | None = None,
    query: type[BaseModel] | None = None,
    admits: Callable[[], bool] | None = None,
    public_when: Callable[[], bool] | None = None,
    tenants: bool = True,
    idempotent: bool = False,
) -> Callable:
    """Register a view on ``blueprint`` and in the OpenAPI description.

    The view receives the validated body as ``body=`` when ``body`` is set, and
    the validated query string as ``query=`` when ``query`` is.
    ``params`` narrows path parameters to a regex (else ``PATH_PARAM_PATTERN``);
    both the document and the check before the view use it. ``admits`` lets a caller in
    without a user's token when it says so (``/metrics``: the scraper's own token);
    ``public_when`` says when it lets anyone in, so the document shows no auth then.
    ``tenants=False`` makes it a system-wide view: ``admits`` alone lets a caller in, and
    any tenant's token, an operator's too, is 403. ``idempotent``: a creating endpoint that
    honours an ``Idempotency-Key`` header (``web.idempotency``).
    """
    if not tenants and admits is None:
        raise ValueError(f"{rule}: a view no tenant reads needs an admits= credential")
    prefix = blueprint.url_prefix or ""
    path, names = _openapi_path(prefix + rule)
    patterns = params or {}
    param_schemas = {n: path_param_schema(patterns.get(n, PATH_PARAM_PATTERN)) for n in names}

    def register(view: Callable) -> Callable:
        @wraps(view)
        def with_body(*args: Any, **kwargs: Any) -> Any:
            check_path_params(param_schemas, kwargs)
            if query is not None:
                kwargs["query"] = validate_query(query)
            if body is not None:
                kwargs["body"] = validate(body, parse_json_body())
            if idempotent:
                return idempotency.run_once(lambda: view(*args, **kwargs))
            return view(*args, **kwargs)

        endpoint = auth.require(role, admits, tenants)(with_body) if authenticated else with_body
        blueprint.add_url_rule(rule, view.__name__, endpoint, methods=[method])
        OPERATIONS.append(
            Operation(
                method.lower(),
                path,
                summary,
                body,
                responses,
                authenticated,
                role,
                names,
                produces,
                param_schemas,
                query,
                blueprint.name,
                public_when,
                tenants,
                idempotent,
            )
        )
        return endpoint

    return register

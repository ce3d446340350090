"""The HTTP API reference page, rendered from the OpenAPI document the web app serves."""

from __future__ import annotations

import json
from typing import Any

from docs.gen.markdown import GENERATED, anchor, code, table

DOCUMENT_PATH = "/api/v1/openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")
API_PREFIX = "/api/v1/"
# Section titles for the first path segment after /api/v1 (any other is title-cased).
GROUPS = {
    "reports": "Reports",
    "jobs": "Jobs of any type",
    "schedulers": "Job schedulers",
    "campaigns": "Notification campaigns",
    "queues": "Queues",
    "bulk-actions": "Bulk actions",
    "system": "System",
    "openapi.json": "This description",
    "docs": "This description",
}
PROBES = "Probes and metrics"
ORDER = [
    "Reports",
    "Jobs of any type",
    "Bulk actions",
    "Job schedulers",
    "Notification campaigns",
    "Queues",
]
# Spelled here, not by http.HTTPStatus, whose wording changes between Python versions.
PHRASES = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    503: "Service Unavailable",
}
ERROR_SHAPE = '{"error": CODE, "message": TEXT, "details": [...]}'

Schema = dict[str, Any]
EN_DASH = "\N{EN DASH}"  # between the ends of a range


def served_document() -> Schema:
    """What ``GET /api/v1/openapi.json`` answers, asked of the app itself (no server)."""
    from web import create_app

    app = create_app({"TESTING": True})
    answer = app.test_client().get(DOCUMENT_PATH)
    if answer.status_code != 200:
        raise RuntimeError(f"GET {DOCUMENT_PATH} answered {answer.status_code}")
    document = answer.get_json()
    assert isinstance(document, dict)
    return document


def schema_link(name: str) -> str:
    return f"[{name}](#schema-{anchor(name)})"


def _literal(value: Any) -> str:
    return code(value if isinstance(value, str) else json.dumps(value))


def type_of(schema: Schema) -> str:
    """A schema's type in a few words, with links to named schemas."""
    if "$ref" in schema:
        return schema_link(schema["$ref"].rsplit("/", 1)[1])
    for key in ("anyOf", "oneOf"):
        if key in schema and "properties" not in schema:
            variants = schema[key]
            words = []
            for variant in variants:
                word = type_of(variant)
                if word not in words:
                    words.append(word)
            return " or ".join(words)
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(_literal(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(type_of({**schema, "type": k}) for k in kind)
    if kind == "array":
        items = schema.get("items")
        return f"array of {type_of(items)}" if items else "array"
    if kind == "object" or "properties" in schema:
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            return f"object of {type_of(values)}"
        if "properties" in schema:
            return "object with " + ", ".join(code(name) for name in schema["properties"])
        return "object"
    if kind == "string" and "format" in schema:
        return f"string ({schema['format']})"
    return str(kind) if kind else "any"


def _bounds(schema: Schema, low: str, high: str, what: str) -> list[str]:
    lo, hi = schema.get(low), schema.get(high)
    if lo is not None and hi is not None:
        return [f"{what}{lo}{EN_DASH}{hi}"]
    if lo is not None:
        return [f"{what}≥ {lo}"]
    if hi is not None:
        return [f"{what}≤ {hi}"]
    return []


def constraints(schema: Schema) -> list[str]:
    """What a value must satisfy, in short notes (from the schema and its non-null variants)."""
    notes: list[str] = []
    for variant in [schema, *schema.get("anyOf", [])]:
        if variant.get("type") == "null" or "$ref" in variant:
            continue
        notes += _bounds(variant, "minimum", "maximum", "")
        if "exclusiveMinimum" in variant:
            notes.append(f"> {variant['exclusiveMinimum']}")
        if "exclusiveMaximum" in variant:
            notes.append(f"< {variant['exclusiveMaximum']}")
        notes += _bounds(variant, "minLength", "maxLength", "length ")
        notes += _bounds(variant, "minItems", "maxItems", "items ")
        if "pattern" in variant:
            notes.append("pattern " + code(variant["pattern"]))
    return notes


def notes_of(schema: Schema, *, with_default: bool = True) -> str:
    parts = []
    if schema.get("description"):
        parts.append(str(schema["description"]))
    parts += constraints(schema)
    if with_default and "default" in schema:
        parts.append("default " + _literal(schema["default"]))
    return "; ".join(parts)


def _group(path: str) -> str:
    if not path.startswith(API_PREFIX):
        return PROBES
    segment = path[len(API_PREFIX) :].split("/", 1)[0]
    return GROUPS.get(segment, segment.title())


def _operations(document: Schema) -> list[tuple[str, str, Schema]]:
    found = []
    for path in sorted(document["paths"]):
        for method in METHODS:
            spec = document["paths"][path].get(method)
            if spec is not None:
                found.append((method.upper(), path, spec))
    return found


def _operation_id(method: str, path: str) -> str:
    return anchor(f"{method} {path}")


def _body(content: Schema) -> str:
    parts = []
    for media_type, entry in sorted(content.items()):
        parts.append(f"{type_of(entry.get('schema', {}))} ({code(media_type)})")
    return "; ".join(parts)


def _parameters(spec: Schema, where: str) -> list[Schema]:
    return [p for p in spec.get("parameters", []) if p["in"] == where]


def operation_section(method: str, path: str, spec: Schema) -> str:
    lines = [f"### {code(f'{method} {path}')} {{#{_operation_id(method, path)}}}", ""]
    lines += [spec.get("summary", "").rstrip(".") + ".", ""]
    auth = "a bearer token" if spec.get("security") else "none"
    lines += [f"Authorization: {auth}.", ""]
    path_params = _parameters(spec, "path")
    if path_params:
        rows = [[code(p["name"]), type_of(p["schema"]), notes_of(p["schema"])] for p in path_params]
        lines += ["Path parameters:", "", table(["name", "type", "notes"], rows), ""]
    query = _parameters(spec, "query")
    if query:
        rows = [
            [
                code(p["name"]),
                type_of(p["schema"]),
                "yes" if p.get("required") else "no",
                notes_of(p["schema"]),
            ]
            for p in query
        ]
        lines += ["Query parameters:", "", table(["name", "type", "required", "notes"], rows), ""]
    body = spec.get("requestBody")
    if body:
        lines += [f"Body: {_body(body['content'])}.", ""]
    rows = []
    for status in sorted(spec["responses"], key=int):
        response = spec["responses"][status]
        phrase = PHRASES.get(int(status), "")
        rows.append([f"{status} {phrase}".strip(), _body(response.get("content", {})) or "—"])
    lines += ["Responses:", "", table(["status", "body"], rows), ""]
    return "\n".join(lines)


def _required_together(schema: Schema) -> list[str]:
    """A schema's ``oneOf`` of required fields, as one sentence."""
    choices = []
    for variant in schema.get("oneOf", []):
        names = variant.get("required", [])
        if names:
            choices.append(" and ".join(code(n) for n in names))
    return [f"Exactly one of {', '.join(choices)}."] if choices else []


def schema_section(name: str, schema: Schema) -> str:
    lines = [f"### {name} {{#schema-{anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    properties = schema.get("properties")
    if not properties:
        lines += [f"Type: {type_of(schema)}.", ""]
        return "\n".join(lines)
    required = set(schema.get("required", []))
    extra = _required_together(schema)
    if schema.get("additionalProperties") is False:
        extra.append("Any other field is refused (400).")
    if extra:
        lines += [" ".join(extra), ""]
    rows = [
        [code(field), type_of(spec), "yes" if field in required else "no", notes_of(spec)]
        for field, spec in properties.items()
    ]
    lines += [table(["field", "type", "required", "notes"], rows), ""]
    return "\n".join(lines)


def render(document: Schema) -> str:
    operations = _operations(document)
    lines = [
        "# HTTP API reference",
        "",
        GENERATED.format(source=f"the OpenAPI document the web app serves at {DOCUMENT_PATH}"),
        "",
        f"Every endpoint of the web app, rendered from the OpenAPI {document['openapi']}"
        f" document it serves at {code(DOCUMENT_PATH)} (and shows as a page at"
        f" {code('/api/v1/docs')}), with both built-in apps on"
        f" ({code('KEEL_BUILTIN_JOBS=reports,notifications')}): the endpoints of an app that"
        " is off answer 404 and are left out of the served document.",
        "",
        f"Bodies are JSON. An error is {code(ERROR_SHAPE)}"
        f" ({schema_link('Error')}). What the endpoints mean — states, retries, owners — is"
        " in [Job semantics](../jobs.md), [Tenants](../tenants.md) and"
        " [Notification campaigns](../campaigns.md).",
        "",
    ]
    for scheme_name, scheme in sorted(document["components"].get("securitySchemes", {}).items()):
        kind = f"HTTP {scheme.get('scheme', '')}".strip()
        token = f" ({scheme['bearerFormat']})" if "bearerFormat" in scheme else ""
        lines += [
            f"Authorization ({code(scheme_name)}): {kind}{token}:"
            f" {code('Authorization: Bearer <token>')}; {code('keel token')} prints one.",
            "",
        ]
    rows = [
        [f"[{code(f'{m} {p}')}](#{_operation_id(m, p)})", spec.get("summary", "")]
        for m, p, spec in operations
    ]
    lines += ["## Endpoints", "", table(["endpoint", "summary"], rows), ""]
    groups: dict[str, list[str]] = {}
    for method, path, spec in operations:
        groups.setdefault(_group(path), []).append(operation_section(method, path, spec))
    ranked = sorted(groups, key=lambda t: (ORDER.index(t) if t in ORDER else len(ORDER), t))
    for title in ranked:
        sections = groups[title]
        lines += [f"## {title}", "", *sections]
    lines += ["## Schemas", ""]
    schemas = document["components"]["schemas"]
    lines += [schema_section(name, schemas[name]) for name in sorted(schemas)]
    return "\n".join(lines).rstrip() + "\n"


def page() -> str:
    return render(served_document())

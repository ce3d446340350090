"""A job type's data model as a form's fields, and a filled form back as the job's data.

The add-job page (``web.ui.new_job``) draws one input per property of the type's
JSON Schema (pydantic's ``model_json_schema``): a number for an integer or a number, a
checkbox for a boolean, a select for an enum, a text field for a string, and a JSON text
area for anything else (a list, an object, a union). The bounds the schema states become
the inputs' ``min``/``max``/``minlength``/``maxlength``, so a browser says most mistakes
before sending; the server then judges the data as the API does, by the model itself.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from werkzeug.datastructures import MultiDict

from tasks.jobs.model.errors import Refused
from web.api import load_json

# ASCII digits only (str.isdigit() also takes "²"), as many as a bigint holds
WHOLE_NUMBER = re.compile(r"[+-]?[0-9]{1,18}")
PREFIX = "data."  # a property's input is named data.<property>: apart from name, opts, csrf


class FieldRefused(Refused):
    """A form's value cannot be read as its property's type."""

    code = "validation_failed"

    def __init__(self, where: str, message: str) -> None:
        detail = {"field": where, "type": "form", "message": message}
        super().__init__(f"the job is refused: {where}: {message}", details=[detail])


@dataclass(frozen=True)
class FormField:
    """One property of a job type's data, as an input."""

    name: str
    label: str
    kind: str  # integer | number | checkbox | select | text | json
    required: bool
    description: str | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    min_length: int | None = None
    max_length: int | None = None
    choices: tuple[Any, ...] = ()
    default: Any = None

    @property
    def input_name(self) -> str:
        return f"{PREFIX}{self.name}"

    def shown_default(self) -> str:
        """The default as the input's first value ("" when there is none)."""
        if self.default is None or (self.kind == "checkbox" and self.default is not True):
            return ""
        if self.kind == "json":
            return json.dumps(self.default)
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


def _resolved(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with its ``$ref`` followed and an ``Optional``'s null dropped."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        own = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**defs.get(ref.removeprefix("#/$defs/"), {}), **own}
    variants = schema.get("anyOf")
    if isinstance(variants, list):
        real = [v for v in variants if v.get("type") != "null"]
        if len(real) == 1:
            inner = _resolved(real[0], defs)
            return {**inner, **{k: v for k, v in schema.items() if k != "anyOf"}}
    return schema


def _kind(schema: dict[str, Any]) -> str:
    if "enum" in schema or "const" in schema:
        return "select"
    return {
        "integer": "integer",
        "number": "number",
        "boolean": "checkbox",
        "string": "text",
    }.get(str(schema.get("type")), "json")


def _bounds(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind == "integer":  # an exclusive bound of an integer is the next integer
        if low is None and schema.get("exclusiveMinimum") is not None:
            low = math.floor(schema["exclusiveMinimum"]) + 1
        if high is None and schema.get("exclusiveMaximum") is not None:
            high = math.ceil(schema["exclusiveMaximum"]) - 1
    return {
        "minimum": low,
        "maximum": high,
        "min_length": schema.get("minLength"),
        "max_length": schema.get("maxLength"),
    }


def fields_of(model: type[BaseModel]) -> list[FormField]:
    """The model's properties as inputs, in the model's order."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    found = []
    for name, raw in schema.get("properties", {}).items():
        prop = _resolved(raw, defs)
        kind = _kind(prop)
        choices = prop["enum"] if "enum" in prop else [prop["const"]] if "const" in prop else []
        found.append(
            FormField(
                name=name,
                label=str(prop.get("title") or name),
                kind=kind,
                required=name in required,
                description=prop.get("description"),
                choices=tuple(choices),
                default=prop.get("default"),
                **_bounds(prop, kind),
            )
        )
    return found


def _number(text: str, kind: str) -> int | float:
    """A number typed into an input (``ValueError`` for anything else): an integer as an int,
    so that an integer property accepts it (the API's models are strict)."""
    text = text.strip()
    if WHOLE_NUMBER.fullmatch(text):
        return int(text)
    if kind == "integer":
        raise ValueError(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _value(form_field: FormField, text: str) -> Any:
    kind = form_field.kind
    if kind in ("integer", "number"):
        try:
            return _number(text, kind)
        except ValueError:
            wanted = "an integer" if kind == "integer" else "a number"
            raise FieldRefused(form_field.name, f"{text[:40]!r} is not {wanted}") from None
    if kind == "select":
        for choice in form_field.choices:
            if str(choice) == text:
                return choice
        raise FieldRefused(form_field.name, f"{text[:40]!r} is not one of the choices")
    if kind == "json":
        return load_json(text, f"{PREFIX}{form_field.name}")
    return text


def data_from(fields: list[FormField], form: MultiDict) -> dict[str, Any]:
    """The data a filled form stands for: an empty input is left out (the model's default
    applies, or the model says the property is required); a checkbox is true or false."""
    data: dict[str, Any] = {}
    for form_field in fields:
        text = form.get(form_field.input_name, "")
        if form_field.kind == "checkbox":
            data[form_field.name] = bool(text)
        elif text != "":
            data[form_field.name] = _value(form_field, text)
    return data

"""The configuration reference page, generated from ``tasks.platform.config.Settings``.

Every field becomes a variable (``KEEL_`` + its name in upper case) with its
type, default and constraints as the model declares them. Its description is
the field's note in ``docs.gen.settings_notes`` if it has one, else its
``description``, else the comment written at it in ``tasks/platform/config.py`` (on its
line, or the comment lines right above it).
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import os
import re
import textwrap
import tokenize
import types
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from docs.gen.markdown import GENERATED, anchor, code, table
from docs.gen.settings_notes import NOTES, OTHER_VARIABLES

TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}


class Undocumented(Exception):
    """A setting the page cannot describe, or a note for a setting that is gone."""


def settings_class() -> type:
    from tasks.platform.config import Settings

    return Settings


def env_name(name: str, field: FieldInfo) -> str:
    from tasks.platform.config import PREFIX

    alias = field.validation_alias or field.alias
    return alias if isinstance(alias, str) else PREFIX + name.upper()


def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return "JSON object"
    if origin in (Union, types.UnionType):
        names = [type_name(arg) for arg in get_args(annotation) if arg is not type(None)]
        return " or ".join(names)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in get_args(annotation))
    return TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds(field: FieldInfo) -> list[str]:
    symbols = {
        annotated_types.Gt: (">", "gt"),
        annotated_types.Ge: ("≥", "ge"),
        annotated_types.Lt: ("<", "lt"),
        annotated_types.Le: ("≤", "le"),
    }
    found = []
    for item in field.metadata:
        for kind, (symbol, attribute) in symbols.items():
            if isinstance(item, kind):
                found.append(f"{symbol} {number(getattr(item, attribute))}")
    return found


def number(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@contextmanager
def _unconfigured() -> Iterator[None]:
    """No ``KEEL_*`` variable, while a default factory runs (``KEEL_HOME``'s reads it)."""
    saved = {n: v for n, v in os.environ.items() if n.startswith("KEEL_")}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)


def default_of(field: FieldInfo) -> str:
    factory = field.default_factory
    if factory is None:
        value = field.default
    else:
        with _unconfigured():
            value = factory()  # type: ignore[call-arg]
    if isinstance(value, Path):
        with suppress(ValueError):  # not under the current folder: shown as it is
            value = "./" + value.relative_to(Path.cwd()).as_posix()
    if isinstance(value, BaseModel):  # a JSON setting: its defaults, as the variable spells them
        value = json.dumps(value.model_dump(by_alias=True))
    elif isinstance(value, dict):
        value = json.dumps(value)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"{code(int(value))} ({'on' if value else 'off'})"
    if isinstance(value, int | float):
        return code(number(value))
    if value == "":
        return "empty"
    return code(value)


def _markdown(comment: str) -> str:
    """A code comment as Markdown: reStructuredText's ``literal`` becomes `literal`."""
    return re.sub(r"``(.+?)``", r"`\1`", comment)


def code_comments(cls: type) -> dict[str, str]:
    """The comment at each field of ``cls`` and the settings classes it extends."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith(("pydantic", "builtins")):
            continue
        found.update(_comments_in(klass))
    return found


def _comments_in(cls: type) -> dict[str, str]:
    """The comment at each field written in ``cls``: on its line, else the lines above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    on_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            on_line[token.start[0]] = token.string.lstrip("#").strip()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    found = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        own = lines[node.lineno - 1].strip()
        if not own.startswith("#") and node.lineno in on_line:
            found[node.target.id] = on_line[node.lineno]
            continue
        above = []
        row = node.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, on_line[row])
            row -= 1
        if above:
            found[node.target.id] = " ".join(above)
    return {name: _markdown(text) for name, text in found.items()}


def descriptions(cls: type) -> dict[str, str]:
    """Each field's description; ``Undocumented`` names what is missing or stale."""
    fields: dict[str, FieldInfo] = cls.model_fields  # type: ignore[attr-defined]
    stale = sorted(set(NOTES) - set(fields))
    if stale:
        raise Undocumented(f"docs/gen/settings_notes.py has notes for no setting: {stale}")
    comments = code_comments(cls)
    found = {}
    missing = []
    for name, field in fields.items():
        text = NOTES.get(name) or field.description or comments.get(name)
        if not text:
            missing.append(env_name(name, field))
        found[name] = text or ""
    if missing:
        raise Undocumented(
            f"settings without a description: {', '.join(missing)}. Write a comment at each in"
            " tasks/platform/config.py (or a description=, or a note in"
            " docs/gen/settings_notes.py)."
        )
    return found


def render(cls: type) -> str:
    fields: dict[str, FieldInfo] = cls.model_fields  # type: ignore[attr-defined]
    texts = descriptions(cls)
    names = {name: env_name(name, field) for name, field in fields.items()}
    clash = sorted(set(OTHER_VARIABLES) & set(names.values()))
    if clash:
        raise Undocumented(f"in Settings, so not an 'other variable': {clash}")
    lines = [
        "# Configuration reference",
        "",
        GENERATED.format(source="tasks.platform.config.Settings"),
        "",
        "Every process of Keel — web, worker, beat, Flower, the `keel` command — is configured"
        " by the same `KEEL_*` environment variables, declared with their types and defaults"
        " in one pydantic model, `tasks.platform.config.Settings`; this page is generated from it.",
        "",
        "A process reads its environment first, then `$KEEL_HOME/env`, the file `keel up`"
        " writes with the effective values of the stack it runs (so every `keel` command and"
        " worker finds the same servers); a variable set in the environment wins. An empty"
        " value means unset (except `KEEL_BUILTIN_JOBS`, where empty means none). A"
        " malformed value stops the process at start, naming the variable.",
        "",
    ]
    rows = [
        [
            f"[{code(names[name])}](#{anchor(names[name])})",
            type_name(field.annotation),
            default_of(field),
        ]
        for name, field in fields.items()
    ]
    lines += [table(["variable", "type", "default"], rows), "", "## Variables", ""]
    for name, field in fields.items():
        facts = [f"Type: {type_name(field.annotation)}", *bounds(field)]
        lines += [
            f"### {code(names[name])} {{#{anchor(names[name])}}}",
            "",
            f"{'; '.join(facts)}. Default: {default_of(field)}.",
            "",
            texts[name],
            "",
        ]
    other = [[code(n), OTHER_VARIABLES[n]] for n in sorted(OTHER_VARIABLES)]
    lines += [
        "## Read outside Settings",
        "",
        "The provider sandbox stands in for a third party and imports nothing of Keel: it"
        " reads its own variables (and `KEEL_SANDBOX_PORT`, `KEEL_SANDBOX_ADMIN_KEY`)."
        " `compose.yaml` reads a few more for the images and passwords it uses.",
        "",
        table(["variable", "what it does"], other),
        "",
    ]
    return "\n".join(lines).rstrip() + "\n"


def page() -> str:
    return render(settings_class())

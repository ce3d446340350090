"""What no id may hold: a control character or a line break.

An id is named again by an API path, a dashboard form or link, a ``keel`` argument or a
log line. One holding such a character is lost to some of them: a path refuses control
characters, ``re.match`` with ``$`` takes a final ``"\\n"``, a log line or a one-line
error breaks at it, and Postgres text cannot hold NUL at all.

``CONTROL`` is a regex character class body, read alike by Python's ``re``, pydantic's
patterns (Rust's ``regex``) and the OpenAPI document's (ECMA-262): C0 controls (NUL, LF,
CR, ...), DEL, C1 controls (NEL, U+0085) and Unicode's line and paragraph separators
(U+2028, U+2029) — every character ``str.splitlines()`` breaks a line at.

Imported by ``keel token``: nothing but ``re`` here.
"""

from __future__ import annotations

import re

CONTROL = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
_CONTROL = re.compile(f"[{CONTROL}]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character or a line break."""
    return _CONTROL.search(text) is not None

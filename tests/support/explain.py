"""``EXPLAIN`` of a SQLAlchemy statement, its parameters bound as the statement's own are
(a JSONB value included): SQLAlchemy's custom-construct recipe, for tests that check a plan."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ClauseElement


class Explain(Executable, ClauseElement):
    inherit_cache = False

    def __init__(self, statement: Any, analyze: bool = False) -> None:
        self.statement = statement
        self.analyze = analyze


@compiles(Explain, "postgresql")
def _explain(element: Explain, compiler: Any, **kw: Any) -> str:
    options = "ANALYZE, BUFFERS" if element.analyze else "COSTS"
    return f"EXPLAIN ({options}) " + compiler.process(element.statement, **kw)


def plan(session: Session, statement: Any, *, analyze: bool = False) -> str:
    """The plan Postgres chooses for ``statement`` (run as well, with ``analyze``)."""
    rows = session.execute(Explain(statement, analyze))
    return "\n".join(row[0] for row in rows)

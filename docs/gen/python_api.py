"""The Python API reference: every name ``keel`` exports, with the first lines of its docs.

Written from ``keel.__all__`` and the objects themselves, so the page lists exactly what
``from keel import …`` gives a user, and nothing internal.
"""

from __future__ import annotations

import inspect

from docs.gen.markdown import GENERATED, code, table

INTRO = """# Python API

{generated}

Import what you use from `keel`, and only from there:

```python
from keel import app, KeelTask, handler, add, JobOptions, UnrecoverableError
```

`celery -A keel worker` (`beat`, `flower`) finds the Celery app as `keel.app`.
Every other module — the `tasks` and `web` packages, and `keel`'s own submodules
— is internal and may change in any release without notice.

"""


def _kind(value: object) -> str:
    if inspect.isclass(value):
        return "exception" if issubclass(value, BaseException) else "class"
    if callable(value) and not hasattr(value, "conf"):
        return "function"
    return "object"


def _summary(value: object) -> str:
    doc = inspect.getdoc(value) or ""
    if hasattr(value, "conf") and hasattr(value, "main"):  # the Celery app: its class's doc
        return "Keel's Celery app: every task on it is a Keel task."
    first = doc.strip().split("\n\n", 1)[0]
    return " ".join(first.split())


def page() -> str:
    import keel

    rows = []
    for name in keel.__all__:
        value = getattr(keel, name)
        rows.append([code(name), _kind(value), _summary(value)])
    intro = INTRO.format(generated=GENERATED.format(source="`keel.__all__`"))
    return intro + table(["name", "kind", "what it is"], rows) + "\n"

"""One logging setup for every Keel process: web, worker, beat, Flower and the CLI.

``configure(role)`` gives the root logger one handler on stderr:

- ``KEEL_LOG_FORMAT=json`` (the default when stderr is not a terminal): one JSON object per
  line, by python-json-logger — ``time`` (UTC, ISO 8601), ``level``, ``logger``,
  ``message``, ``process`` (the role: ``web``, ``worker``, ``beat``, ``flower``, ``cli``),
  ``pid``, whatever a call passes as ``extra=``, and where known the job's and the
  request's fields (``FIELDS``); an exception as ``exc_info``, its traceback in one string.
- ``KEEL_LOG_FORMAT=text`` (the default on a terminal): Celery's familiar line,
  ``[time: LEVEL/ProcessName] message``, then the same fields as ``key=value``.
- ``KEEL_LOG_LEVEL`` (``INFO``; a worker's ``-l`` when the variable is unset).

**Job fields.** A line logged while a job runs — Keel's own, the handler's, Celery's task
logger's (``celery.utils.log.get_task_logger``) — carries ``job_id``, ``job_name``,
``queue``, ``tenant_id`` and ``attempt``, read from Celery's current task when the line is
formatted (in the process and thread that logged it).

**Request fields.** The web app binds ``request_id`` and, once the caller is known,
``tenant_id`` for the length of a request (``bind``); a job added by that request is logged
with them by the web app, and with its ``job_id`` by the worker.

**Secrets never leave.** Every formatted line (message, extras and traceback alike) goes
through ``redact``: bearer tokens, JWTs, a URL's password and the configured secrets
(``KEEL_SECRET_KEY``, Flower's password, the sandbox's admin key) are replaced by ``***``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from tasks.platform import tracing

FIELDS = (
    "job_id",
    "job_name",
    "queue",
    "tenant_id",
    "attempt",
    "request_id",
    "trace_id",
    "span_id",
)
ROLES = ("web", "worker", "beat", "flower", "cli", "keel")

_bound: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("keel_log_fields")
_role = {"name": "keel"}

_PATTERNS = (
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1***"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), "***"),
    (re.compile(r"(://[^:/@\s\"']*:)[^@\s\"']+@"), r"\1***@"),  # redis://:pw@ too
)
_secrets: list[str] = []


def redact(line: str) -> str:
    """``line`` without bearer tokens, JWTs, URL passwords or the configured secrets."""
    for pattern, replacement in _PATTERNS:
        line = pattern.sub(replacement, line)
    for secret in _secrets:
        line = line.replace(secret, "***")
    return line


@contextmanager
def bind(**fields: Any) -> Iterator[dict[str, Any]]:
    """Log ``fields`` with every line of this context (a request); the dict can be added to."""
    current = {**_bound.get({}), **{k: v for k, v in fields.items() if v is not None}}
    token = _bound.set(current)
    try:
        yield current
    finally:
        _bound.reset(token)


def job_fields() -> dict[str, Any]:
    """The running job's fields, if this thread runs one (Celery's current task)."""
    from celery._state import get_current_task  # Celery is imported by then in a worker

    task = get_current_task()
    request = getattr(task, "request", None)
    if task is None or request is None or request.id is None:
        return {}
    job = getattr(request, "keel_job", None)
    delivery = getattr(request, "delivery_info", None) or {}
    fields: dict[str, Any] = {"job_id": request.id, "job_name": task.name}
    queue = getattr(job, "queue", None) or delivery.get("routing_key")
    if queue:
        fields["queue"] = queue
    tenant_id = getattr(job, "tenant_id", None)
    if tenant_id:
        fields["tenant_id"] = tenant_id
    started = getattr(job, "attempts_started", None)
    fields["attempt"] = started if started else int(request.retries or 0) + 1
    return fields


def context_fields() -> dict[str, Any]:
    """What a line logged here and now carries besides its own: the request's, the job's."""
    return {**_bound.get({}), **job_fields(), **tracing.ids()}


_base_factory = logging.getLogRecordFactory()


def _record_with_context(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """Every record takes the fields of where it was made (its thread's request or job),
    whichever handler formats it later and wherever."""
    record = _base_factory(*args, **kwargs)
    record.keel_fields = context_fields()
    return record


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    found = getattr(record, "keel_fields", None)
    return found if isinstance(found, dict) else context_fields()


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


class JsonLines(JsonFormatter):
    """One JSON object per record (see the module)."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, "keel_fields"],
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = _iso(record.created)
        super().add_fields(log_data, record, message_dict)
        log_data["process"] = _role["name"]
        log_data["pid"] = record.process
        for name, value in _fields_of(record).items():
            log_data.setdefault(name, value)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


# A record's own attributes: what is not among them was passed as ``extra=``.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "keel_fields",
}


class TextLines(logging.Formatter):
    """Celery's own line, ``[time: LEVEL/ProcessName] message``, then the role and the
    fields as ``key=value`` (see the module)."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        # Scalars only: a structured extra (Celery's ``data`` repeats its message) is JSON's.
        extras = {
            k: v
            for k, v in vars(record).items()
            if k not in _RECORD_ATTRS and not isinstance(v, dict | list | tuple)
        }
        fields = {"process": _role["name"], **extras, **_fields_of(record)}
        suffix = "".join(f" {k}={v}" for k, v in fields.items() if v is not None)
        head = f"[{_iso(record.created)}: {record.levelname}/{record.processName}]"
        if "\n" in message:  # a traceback: the fields go on the first line
            first, rest = message.split("\n", 1)
            return redact(f"{head} {first}{suffix}\n{rest}")
        return redact(f"{head} {message}{suffix}")


def formatter(kind: str | None = None, stream: TextIO | None = None) -> logging.Formatter:
    """The formatter ``KEEL_LOG_FORMAT`` (or ``kind``) names; ``auto``: text on a terminal."""
    from tasks.platform.config import get_settings

    kind = kind or get_settings().log_format
    if kind == "auto":
        isatty = getattr(stream or sys.stderr, "isatty", None)
        kind = "text" if isatty is not None and isatty() else "json"
    return TextLines() if kind == "text" else JsonLines()


# SQLAlchemy's reading of a URL's password (``make_url``): up to the first "@", so "/",
# "?" and "#" may be in it; redis-py and kombu read it as urllib does (up to the last "@").
_SQLALCHEMY_PASSWORD = re.compile(r"[\w+]+://[^:/]*:([^@]*)@")


def _url_passwords(url: str) -> set[str]:
    """A URL's password as each client that may read it finds it, as written."""
    found = set()
    with contextlib.suppress(ValueError):  # urllib refuses it: SQLAlchemy's reading stays
        found.add(urlsplit(url).password or "")
    matched = _SQLALCHEMY_PASSWORD.match(url)
    if matched:
        found.add(matched.group(1))
    return found - {""}


def _remember_secrets() -> None:
    """The configured secrets and the servers' passwords, as written and as JSON escapes them."""
    from tasks.platform.config import get_settings

    settings = get_settings()
    found = [settings.secret_key, settings.flower_password, settings.sandbox_admin_key]
    found.append(settings.metrics_token)
    for url in (settings.database_url, settings.redis_url, settings.broker_url):
        if url:
            found += [p for w in _url_passwords(url) for p in (w, unquote(w))]
    variants = {v for s in found if s and len(s) >= 8 for v in (s, json.dumps(s)[1:-1])}
    _secrets[:] = sorted(variants, key=len, reverse=True)


def configure(
    role: str, level: str | int | None = None, stream: TextIO | None = None, *, quiet: bool = False
) -> None:
    """Give this process Keel's logging: one handler on ``stream`` (stderr), Keel's format,
    ``KEEL_LOG_LEVEL`` (else ``level``, else INFO); Python's warnings go through it too.

    ``quiet`` (a ``keel`` command not asked for ``--verbose``): warnings and errors only,
    whatever ``KEEL_LOG_LEVEL`` says, so that a command's streams carry its own output."""
    from tasks.platform.config import get_settings

    _role["name"] = role
    _remember_secrets()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(stream=stream))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if quiet and level else get_settings().log_level or level or logging.INFO)
    logging.setLogRecordFactory(_record_with_context)
    logging.captureWarnings(True)


def gunicorn_config(role: str = "web") -> dict[str, Any]:
    """gunicorn's ``logconfig_dict``: its error log and every other logger through Keel's
    format on stderr (its own access log stays off: the app writes one, ``web.access``)."""
    from tasks.platform.config import get_settings

    _role["name"] = role
    _remember_secrets()
    logging.setLogRecordFactory(_record_with_context)
    level = get_settings().log_level or "INFO"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "root": {"level": level, "handlers": ["console"]},
        "loggers": {
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            # A logging config turns gunicorn's access log on; the app's (web.access) is the one.
            "gunicorn.access": {"level": "CRITICAL", "handlers": [], "propagate": False},
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "keel",
                "stream": "ext://sys.stderr",
            },
            "error_console": {
                "class": "logging.StreamHandler",
                "formatter": "keel",
                "stream": "ext://sys.stderr",
            },
        },
        "formatters": {
            "keel": {"()": "tasks.platform.logs.formatter"},
            "generic": {"()": "tasks.platform.logs.formatter"},
        },
    }

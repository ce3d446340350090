"""Traces: OpenTelemetry, set up by the standard ``OTEL_*`` variables, off unless asked for.

``OTEL_TRACES_EXPORTER`` turns it on (``otlp``, ``console``, or both comma-separated;
unset or ``none``: off, and nothing here costs more than a flag test). OpenTelemetry comes
with the ``[otel]`` extra (``pip install 'keel-jobs[otel]'``): an exporter asked for without
it is refused in one line, as an unknown one is. The SDK reads
the rest itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
(OTLP over HTTP/protobuf), ``OTEL_SERVICE_NAME`` (default ``keel-<role>``: ``keel-web``,
``keel-worker``, ``keel-beat``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``
and its argument, ``OTEL_BSP_*`` for the batch exporter.

One trace per job, from the request that added it:

- the API's request span (Flask's instrumentation) holds ``keel.add``, which holds the
  record's insert (psycopg's) and the publish (Celery's ``apply_async/<task>``, which
  puts the context in the message's headers);
- ``keel.add``'s context is also kept on the record, apart from the call's headers
  (``celery_ctx.trace``: W3C ``traceparent``/``tracestate`` only, never baggage), so a job
  published later — delayed, retried, parked while the broker was down, held by a limit,
  republished after a stall — is published in that context again (``restored``): the
  promoter's ``apply_async`` span, and the run it wakes, join the trace of the request,
  whatever the promoter was doing. A job recorded inside a run (a chain's next step, a
  chord's body, a message that arrived without a record) keeps the run's context so;
- a run is Celery's ``run/<task>`` span, holding ``keel.claim``, ``keel.handler`` and
  ``keel.finish``, and every statement and Redis call made meanwhile; what a run sends
  (a chain's next step, a link, a chord's body, a ``.delay()``) is published from inside
  it, so it is the run's child.

Keel's statements go through psycopg directly on its hot paths (not through SQLAlchemy's
ORM), so psycopg's instrumentation is the one that sees them all; Redis's sees events,
locks and publishes. Statements and Redis calls with no span around them (the workers'
upkeep loops, heartbeats, polls) would each start a one-span trace, many a second:
``QuietRoots`` drops those, and leaves every other sampling decision to the configured
sampler.

Each process sets this up once (``configure``): the API in ``create_app`` (each
gunicorn worker process), Celery's worker, beat and Flower where they set up logging
(before the pool forks: the SDK's batch processor restarts its thread in each child, and
``configure`` drops the OTLP exporters' pooled connections there, which would otherwise be
the parent's sockets). A process that ends without running ``atexit`` — a prefork child
(``worker_process_shutdown``), a gunicorn worker's quick stop (``worker_int``) — calls
``flush`` first, or the spans of its last seconds would be lost.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

log = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console")
# What tracing imports (the [otel] extra), and what the otlp exporter adds to it.
OTEL_MODULES = (
    "opentelemetry.sdk",
    "opentelemetry.instrumentation.celery",
    "opentelemetry.instrumentation.flask",
    "opentelemetry.instrumentation.psycopg",
    "opentelemetry.instrumentation.redis",
)
OTLP_MODULES = ("opentelemetry.exporter.otlp.proto.http",)
OTEL_EXTRA = "pip install 'keel-jobs[otel]'"
# Requests that would each be a trace of their own, to no one's use: probes and scrapes.
# (regexes searched in the whole URL: anchored to the path, so that a job id, a queue name
# or a query holding "metrics" is still traced)
EXCLUDED_URLS = "/healthz$,/readyz$,/livez$,/metrics$"
_state: dict[str, Any] = {"on": False, "configured": False, "tracer": None, "provider": None}
# What ``flush`` waits at most, at a process's end (a stop must not hang on a dead collector).
FLUSH_TIMEOUT_MS = 2000
_NOTHING: AbstractContextManager[None] = nullcontext()


class _NoSpan:
    """What ``span`` yields when tracing is off (OpenTelemetry is not even imported then)."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = nullcontext(_NoSpan())


def exporters(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names; none when unset or ``none``."""
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    unknown = sorted(set(names) - set(EXPORTERS))
    if unknown:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={environ['OTEL_TRACES_EXPORTER']}: Keel exports traces "
            f"with otlp (OTLP over HTTP) or console, not {', '.join(unknown)}"
        )
    absent = _missing([*OTEL_MODULES, *(OTLP_MODULES if "otlp" in names else ())]) if names else []
    if absent:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={environ['OTEL_TRACES_EXPORTER']}: tracing needs "
            f"`{OTEL_EXTRA}` ({', '.join(absent)} not installed)"
        )
    return names


def _missing(modules: list[str]) -> list[str]:
    """The modules of ``modules`` that are not installed (looked for, not imported)."""
    from importlib.util import find_spec

    absent = []
    for module in modules:
        try:
            found = find_spec(module) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            absent.append(module)
    return absent


def on() -> bool:
    """Whether this process traces (``configure`` found an exporter)."""
    return _state["on"]


def configure(role: str) -> bool:
    """Set up tracing for this process once, if ``OTEL_TRACES_EXPORTER`` asks for it."""
    if _state["configured"]:
        return _state["on"]
    names = exporters()  # (an unknown name raises, here and at every later call)
    _state["configured"] = True
    if not names:
        return False
    for name in [n for n, value in os.environ.items() if n.startswith("OTEL_") and not value]:
        del os.environ[name]  # empty is unset, as for Keel's settings (compose passes "")
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, Any] = {"keel.process": role}
    named = "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not os.environ.get("OTEL_SERVICE_NAME") and not named:
        attributes["service.name"] = f"keel-{role}"
    sampler: Any = QuietRoots()  # a Sampler by its methods (the SDK is imported late)
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
    sessions: list[Any] = []  # the OTLP exporters' HTTP sessions (``_drop_pooled_connections``)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, sessions)))
    os.register_at_fork(after_in_child=lambda: _drop_pooled_connections(sessions))
    trace.set_tracer_provider(provider)
    _state["provider"] = provider
    _state["tracer"] = trace.get_tracer("keel")
    CeleryInstrumentor().instrument(tracer_provider=provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    RedisInstrumentor().instrument(tracer_provider=provider)
    _state["on"] = True
    log.info("tracing on: %s exporter(s), service %s", ",".join(names), _service(provider))
    return True


def flush(timeout_millis: int = FLUSH_TIMEOUT_MS) -> bool:
    """Export the spans this process still holds (for a process about to ``os._exit``)."""
    provider = _state["provider"]
    if provider is None:
        return True
    try:
        return bool(provider.force_flush(timeout_millis))
    except Exception:  # a process on its way out: say so, and let it go
        log.warning("tracing: the last spans could not be exported", exc_info=True)
        return False


def _drop_pooled_connections(sessions: list[Any]) -> None:
    """In a forked child: forget the connections the parent's exporters had open.

    A pooled keep-alive connection is a socket the parent still uses: two processes writing
    requests on one socket interleave them. Closing the child's copy of the descriptor leaves
    the parent's connection as it was; the child's next export opens its own.
    """
    for session in sessions:
        session.close()


def _service(provider: Any) -> str:
    return str(provider.resource.attributes.get("service.name", ""))


def _exporter(name: str, sessions: list[Any]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # One span a line (the SDK's default spreads each over twenty): a log reader,
        # ``keel up``'s output and ``jq`` take it as they take Keel's JSON log lines.
        return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Keel's own session, so that a forked child can drop the parent's connections.
    sessions.append(requests.Session())
    return OTLPSpanExporter(session=sessions[-1])


def instrument_flask(app: Any) -> None:
    """The API's request spans (on when ``configure`` turned tracing on)."""
    if not on():
        return
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    excluded = os.environ.get("OTEL_PYTHON_FLASK_EXCLUDED_URLS", EXCLUDED_URLS)
    FlaskInstrumentor().instrument_app(app, excluded_urls=excluded)


class QuietRoots:
    """The configured sampler (``OTEL_TRACES_SAMPLER``, parent-based always-on by default),
    except that a client span with no parent — a statement or Redis call made outside any
    request or run — is dropped rather than made a trace of its own."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.sampling import _get_from_env_or_default

        self._configured = _get_from_env_or_default()

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> Any:
        from opentelemetry import trace
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult

        parent = trace.get_current_span(parent_context).get_span_context()
        if kind == trace.SpanKind.CLIENT and not parent.is_valid:
            return SamplingResult(Decision.DROP)
        return self._configured.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"QuietRoots{{{self._configured.get_description()}}}"


def span(name: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A Keel span around a block (the span is yielded); a no-op span when tracing is off."""
    if not _state["on"]:
        return _NO_SPAN
    return _state["tracer"].start_as_current_span(name, attributes=attributes)


def carried(ctx: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's Celery context with the current trace context (``trace``), to be kept on its
    record; unchanged when tracing is off or nothing is being traced."""
    if not _state["on"] or not _current().is_valid:
        return ctx
    carrier: dict[str, str] = {}
    _w3c().inject(carrier)
    if not carrier:
        return ctx
    return {**(ctx or {}), "trace": carrier}


def restored(carrier: Mapping[str, Any] | None) -> AbstractContextManager[None]:
    """Inside the block, the trace context ``carrier`` holds (a record's ``trace``) is
    current, unless a span is already (a run publishing its chain's next step stays that
    step's parent) or there is none."""
    if not _state["on"] or not carrier or _current().is_valid:
        return _NOTHING  # (one object for every publish: the hot path when tracing is off)
    return _attached(carrier)


@contextmanager
def _attached(carrier: Mapping[str, Any]) -> Iterator[None]:
    from opentelemetry import context

    token = context.attach(_w3c().extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def _w3c() -> Any:
    """W3C trace context: how a record keeps its trace, whatever ``OTEL_PROPAGATORS`` says
    (that is for messages and requests; the record is read back only by Keel)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def ids() -> dict[str, str]:
    """The current span's ``trace_id`` and ``span_id`` (hex), for log lines; none if off."""
    if not _state["on"]:
        return {}
    current = _current()
    if not current.is_valid:
        return {}
    return {
        "trace_id": format(current.trace_id, "032x"),
        "span_id": format(current.span_id, "016x"),
    }


def _current() -> Any:
    from opentelemetry import trace

    return trace.get_current_span().get_span_context()

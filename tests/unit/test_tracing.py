"""Tracing's pure parts: which exporters ``OTEL_TRACES_EXPORTER`` asks for, which spans are
sampled, and that nothing changes while tracing is off. (Traces across real processes:
tests/integration/test_traces.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tasks.platform import tracing

KEEL = str(Path(sys.executable).with_name("keel"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", []),
        ("none", []),
        ("otlp", ["otlp"]),
        (" OTLP , console ", ["otlp", "console"]),
        ("console,none", ["console"]),
    ],
)
def test_the_exporters_named(value, expected):
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": value}) == expected


def test_unset_is_off():
    assert tracing.exporters({}) == []


def test_an_exporter_keel_does_not_ship_is_refused_by_name():
    with pytest.raises(ValueError, match=r"not jaeger, zipkin$"):
        tracing.exporters({"OTEL_TRACES_EXPORTER": "otlp,zipkin,jaeger"})


def test_keel_up_refuses_an_unknown_exporter_in_one_line(tmp_path):
    env = {**os.environ, "KEEL_HOME": str(tmp_path / "home"), "OTEL_TRACES_EXPORTER": "jaeger"}
    done = subprocess.run(
        [KEEL, "up"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "OTEL_TRACES_EXPORTER=jaeger" in lines[0], done.stderr


def _sampled(provider: TracerProvider, kind: trace.SpanKind, parent: bool) -> bool:
    tracer = provider.get_tracer("test")
    if not parent:
        return tracer.start_span("child", kind=kind).is_recording()
    with tracer.start_as_current_span("parent", kind=trace.SpanKind.SERVER):
        return tracer.start_span("child", kind=kind).is_recording()


def test_a_statement_outside_any_request_or_run_is_not_a_trace_of_its_own(monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    provider = TracerProvider(sampler=tracing.QuietRoots())
    # a client span (a statement, a Redis call) with no parent: dropped
    assert not _sampled(provider, trace.SpanKind.CLIENT, parent=False)
    # the same inside a request or a run: kept
    assert _sampled(provider, trace.SpanKind.CLIENT, parent=True)
    # a request, a run, a publish: roots of their own
    for kind in (trace.SpanKind.SERVER, trace.SpanKind.CONSUMER, trace.SpanKind.PRODUCER):
        assert _sampled(provider, kind, parent=False)


def test_the_configured_sampler_decides_the_rest(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider = TracerProvider(sampler=tracing.QuietRoots())
    assert not _sampled(provider, trace.SpanKind.SERVER, parent=False)
    assert "AlwaysOff" in tracing.QuietRoots().get_description()


def test_off_changes_nothing_a_job_carries():
    assert not tracing.on()
    ctx = {"headers": {"x-request": "1"}}
    assert tracing.carried(ctx) is ctx and tracing.carried(None) is None
    assert tracing.ids() == {}
    with tracing.span("keel.add") as span:
        span.set_attribute("keel.job.id", "x")  # a no-op, not an error


def test_the_add_s_context_is_kept_apart_from_the_call_s_headers(monkeypatch):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    monkeypatch.setitem(tracing._state, "on", True)
    with provider.get_tracer("test").start_as_current_span("request") as current:
        trace_id = format(current.get_span_context().trace_id, "032x")
        token = context.attach(baggage.set_baggage("tenant", "t-1"))
        try:
            ctx = tracing.carried({"group": "g", "headers": {"x-request": "1"}})
        finally:
            context.detach(token)
        assert ctx is not None and ctx["group"] == "g"
        assert ctx["headers"] == {"x-request": "1"}  # the caller's, as given
        assert set(ctx["trace"]) == {"traceparent"}  # no baggage on the record
        assert ctx["trace"]["traceparent"].split("-")[1] == trace_id
        assert tracing.ids()["trace_id"] == trace_id
    # later, in another process's loop (nothing current): the publish joins that trace
    with tracing.restored(ctx["trace"]):
        assert tracing.ids()["trace_id"] == trace_id
    assert tracing.ids() == {}
    with tracing.restored(None):  # a record from before tracing was on
        assert tracing.ids() == {}


def test_a_run_publishing_stays_the_parent_of_what_it_sends(monkeypatch):
    provider = TracerProvider()
    monkeypatch.setitem(tracing._state, "on", True)
    kept = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("run") as run, tracing.restored(kept):
        assert tracing.ids()["trace_id"] == format(run.get_span_context().trace_id, "032x")


def test_flush_exports_what_a_process_still_holds(monkeypatch):
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exported, schedule_delay_millis=60_000))
    monkeypatch.setitem(tracing._state, "provider", provider)
    provider.get_tracer("test").start_span("last").end()
    assert exported.get_finished_spans() == ()  # held for the next batch
    assert tracing.flush()
    assert [s.name for s in exported.get_finished_spans()] == ["last"]
    provider.shutdown()


def test_a_forked_child_drops_the_exporters_pooled_connections(monkeypatch):
    """Each OTLP exporter posts through a session of Keel's, which a child closes: its next
    export opens a connection of its own, never one of the parent's sockets."""
    import requests

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    sessions: list = []
    tracing._exporter("otlp", sessions)
    tracing._exporter("console", sessions)
    assert len(sessions) == 1 and isinstance(sessions[0], requests.Session)
    pool = sessions[0].get_adapter("http://127.0.0.1:9").poolmanager
    pool.connection_from_url("http://127.0.0.1:9")  # a pool, as an export leaves one
    assert len(pool.pools) == 1
    tracing._drop_pooled_connections(sessions)
    assert len(pool.pools) == 0


def test_a_celery_worker_refuses_an_unknown_exporter_rather_than_run_untraced(tmp_path):
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "jaeger"}
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("celery")),
            "-A",
            "tasks.celery",
            "worker",
            "--pool=solo",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "keel: OTEL_TRACES_EXPORTER=jaeger" in done.stderr, done.stderr[-2000:]

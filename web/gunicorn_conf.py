"""Gunicorn settings for Keel's API, in one place.

    gunicorn -c python:web.gunicorn_conf -b 127.0.0.1:8000 'web:create_app()'

``keel up``, compose and the container image all serve the API this way.
The address stays on the command line (it is what every deployment sets);
anything here can be overridden there too, or with ``GUNICORN_CMD_ARGS``.
Why threads, and what the worker class adds: ``web.serving``.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from tasks.platform import db, logs, tracing
from tasks.platform.config import get_settings
from tasks.platform.lifeline import die_with_parent
from web import metrics_lease

worker_class = "web.serving.StreamingWorker"
# Processes (KEEL_WEB_WORKERS), each with a pool of threads: up to
# threads - web.serving.REQUEST_THREADS of them may hold event streams.
workers = get_settings().web_workers
threads = 128
# gthread beats from each process's main loop, not from the request threads, so
# this only catches a wedged process: it is no limit on a request or a stream.
# Requests are bounded by their own deadlines (tasks.platform.db, tasks.platform.broker); streams
# by their ``timeout`` (web.events.MAX_TIMEOUT_S).
timeout = 30
graceful_timeout = 20
# An idle kept-alive connection (or a new one that sent nothing) waits this long,
# without a thread, for its next request.
keepalive = 5
# gunicorn's control socket lives at one path per user ($XDG_RUNTIME_DIR or
# ~/.gunicorn/gunicorn.ctl), so two servers of one user (two stacks, or a test
# run beside `keel up`) would take it from each other. Keel does not use it.
control_socket_disable = True
# gunicorn's own lines in Keel's format (tasks.platform.logs); the access log is the app's
# (web.access).
logconfig_dict = logs.gunicorn_config("web")


def post_fork(server: Any, worker: Any) -> None:
    """A worker dies with its master: whatever ends the master (``kill -9`` included) leaves
    no worker serving on its own until it notices (it checks once a second, then lets its
    requests finish)."""
    die_with_parent(signal.SIGKILL)
    metrics_lease.set_server(server.pid)  # the master's workers answer /metrics alike


def worker_int(worker: Any) -> None:
    """SIGINT or SIGQUIT — gunicorn's quick stop, and what the web child of ``keel up`` gets
    when ``keel up`` dies: the worker exits now. gunicorn's own ``sys.exit`` would wait for
    every request thread to finish its request, and the master waits for its workers up to
    ``graceful_timeout``. A graceful stop is SIGTERM, unchanged. The spans it still holds are
    exported first (``os._exit`` skips ``atexit``; bounded:
    ``tasks.platform.tracing.FLUSH_TIMEOUT_MS``)."""
    tracing.flush()
    os._exit(0)


def post_worker_init(worker: Any) -> None:
    """A worker opens its database connections before it accepts requests
    (``tasks.platform.db.warm``):
    a burst of requests on a fresh process would otherwise pay for them inside their deadline."""
    db.warm()

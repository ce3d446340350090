"""Serving the sandbox: werkzeug's threaded server, stopped cleanly by a signal.

A thread per request matters: a fault can hold a request for 30 s, and the
other requests must go on meanwhile.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from werkzeug.serving import BaseWSGIServer, make_server

from provider_sandbox.app import create_app
from provider_sandbox.state import EXTENSION, Sandbox

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve(host: str, port: int, home: Path) -> None:
    """Serve the sandbox on ``host:port`` until SIGTERM or SIGINT (port 0: any free one)."""
    app = create_app(home)
    sandbox: Sandbox = app.extensions[EXTENSION]
    server = make_server(host, port, app, threaded=True)
    previous = _stop_on_signals(server, sandbox)
    print(
        f"provider sandbox listening on http://{host}:{server.server_port} (data in {home})",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sandbox.close()
        server.server_close()
        print("provider sandbox stopped", flush=True)


def _stop_on_signals(server: BaseWSGIServer, sandbox: Sandbox) -> dict:
    """Install the stop handlers; returns the ones they replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # signals reach the main thread only; the caller stops us

    def stop(signum: int, frame: object) -> None:
        sandbox.stopping.set()
        # shutdown() waits for serve_forever(), which runs below this handler.
        threading.Thread(target=server.shutdown, daemon=True).start()

    return {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}

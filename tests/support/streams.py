"""Raw HTTP clients for the serving tests: event streams, slow heads, server-side sockets.

A browser's ``EventSource`` holds one connection open per stream; these
helpers do the same with plain sockets, so a test can hold fifty of them
without fifty threads, close them the way a client does, and then look at
the server's side of each connection.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass


def _request(path: str, token: str | None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
        f"Accept: text/event-stream\r\nConnection: close\r\n{extra}\r\n"
    ).encode()


@dataclass
class Stream:
    """One open event stream: its socket, when it opened, and the response head."""

    sock: socket.socket
    opened_at: float
    head: bytes

    @property
    def client_port(self) -> int:
        return self.sock.getsockname()[1]

    def read_to_end(self, limit_s: float) -> tuple[bytes, float]:
        """Everything until the server ends the stream; (body, seconds the stream lasted).

        Then the socket is closed, as a client does once the server has: the
        server lingers on a closed connection until the client's side is closed too.
        """
        self.sock.settimeout(limit_s)
        body = b""
        try:
            while chunk := self.sock.recv(65536):
                body += chunk
        finally:
            self.sock.close()
        return body, time.monotonic() - self.opened_at

    def close(self) -> None:
        self.sock.close()


def open_stream(port: int, path: str, token: str, timeout_s: float = 5) -> Stream:
    """Send the request and read the response head (the stream stays open)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    opened_at = time.monotonic()
    sock.sendall(_request(path, token))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return Stream(sock, opened_at, head)


def slow_head(port: int, every_s: float, give_up_s: float) -> float | None:
    """Send a request head one header line every ``every_s``, never finishing it.

    Returns how many seconds passed until the server hung up, or ``None`` if
    it still listened after ``give_up_s``.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=give_up_s)
    started = time.monotonic()
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(every_s)
        while time.monotonic() - started < give_up_s:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                pass
            except OSError:  # reset
                return time.monotonic() - started
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                return time.monotonic() - started
        return None
    finally:
        sock.close()


def held_client_ports(server_pids: set[int], server_port: int) -> set[int]:
    """Client ports of the connections the server processes still hold open on ``server_port``.

    ``CLOSE_WAIT`` counts as held: the client has gone but the server has not
    let go of the connection (nor of the thread behind it).
    """
    import psutil

    held: set[int] = set()
    for pid in server_pids:
        process = psutil.Process(pid)
        listing = getattr(process, "net_connections", None) or process.connections
        for conn in listing(kind="tcp"):
            if not (conn.laddr and conn.raddr and conn.laddr.port == server_port):
                continue
            if conn.status in (psutil.CONN_ESTABLISHED, psutil.CONN_CLOSE_WAIT):
                held.add(conn.raddr.port)
    return held

"""A TLS-terminating reverse proxy on loopback, as a deployment puts in front of gunicorn.

``throwaway_certificate`` makes a self-signed certificate for 127.0.0.1 and
localhost (``cryptography``); ``TlsProxy`` accepts TLS on a free loopback port
and forwards each connection's requests in plain HTTP to the upstream port,
replacing any ``X-Forwarded-*`` header the client sent with
``X-Forwarded-Proto: https`` and ``X-Forwarded-For`` — which gunicorn trusts
from loopback (``forwarded_allow_ips``), so the app sees HTTPS requests.
Responses (event streams included) are copied back byte for byte.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from keel.embedded import free_port

MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path
    spki_sha256: str  # base64: Chromium's --ignore-certificate-errors-spki-list


def throwaway_certificate(folder: Path) -> Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keel test proxy")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "proxy.crt", folder / "proxy.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return Certificate(
        cert_path, key_path, base64.b64encode(hashlib.sha256(spki).digest()).decode()
    )


@dataclass
class TlsProxy:
    """https://127.0.0.1:<port> in front of http://127.0.0.1:<upstream_port>."""

    certificate: Certificate
    upstream_port: int
    port: int = field(default_factory=free_port)
    _listener: socket.socket | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TlsProxy:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate.cert, self.certificate.key)
        context.set_alpn_protocols(["http/1.1"])
        listener = socket.create_server(("127.0.0.1", self.port))
        self._listener = context.wrap_socket(listener, server_side=True)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, address = self._listener.accept()
            except (OSError, ssl.SSLError):
                if self._stopped.is_set():
                    return
                continue  # a handshake a client gave up on
            threading.Thread(target=self._serve, args=(client, address[0]), daemon=True).start()

    def _serve(self, client: socket.socket, peer: str) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        threading.Thread(target=_copy, args=(upstream, client), daemon=True).start()
        try:
            self._requests(client, upstream, peer)
        finally:
            _close(upstream)

    def _requests(self, client: socket.socket, upstream: socket.socket, peer: str) -> None:
        """Each request's head, rewritten, then its body (Content-Length), until the end."""
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = _recv(client)
                if not chunk or len(buffer) > MAX_HEAD_BYTES:
                    return
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            request_line, *lines = head.decode("latin-1").split("\r\n")
            kept = [line for line in lines if not line.lower().startswith("x-forwarded-")]
            kept += ["X-Forwarded-Proto: https", f"X-Forwarded-For: {peer}"]
            length = 0
            for line in kept:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
                if name.strip().lower() == "transfer-encoding":
                    return  # not sent by the dashboard's forms
            upstream.sendall("\r\n".join([request_line, *kept, "", ""]).encode("latin-1"))
            while length > 0:
                if not buffer:
                    buffer = _recv(client)
                    if not buffer:
                        return
                part, buffer = buffer[:length], buffer[length:]
                upstream.sendall(part)
                length -= len(part)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _copy(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := _recv(source):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(target)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()

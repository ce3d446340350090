"""A ``redis-server`` speaking TLS only, to an ACL user (``tests/integration/test_redis_tls.py``).

``make_authority`` makes a throwaway certificate authority (``cryptography``) and
``issue`` a certificate it signs: the server's for 127.0.0.1 and localhost, and a
client's. ``TlsRedis`` runs Debian's ``redis-server`` with ``--port 0`` (no plain
listener) and ``--tls-port``, asking clients for a certificate of that authority
(``tls-auth-clients yes``), with the ``default`` user off and one ACL user, ``keel``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import shutil
import signal
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from keel.embedded import free_port
from tests.support.stack import wait_for

USER = "keel"


@dataclass(frozen=True)
class Authority:
    cert: Path
    key: ec.EllipticCurvePrivateKey
    name: x509.Name


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def make_authority(folder: Path, common_name: str) -> Authority:
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{common_name.replace(' ', '-')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(path, key, name)


def issue(authority: Authority, folder: Path, name: str, *, server: bool) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(authority.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(authority.key, hashes.SHA256())
    cert_path = folder / f"{name}.crt"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Issued(cert_path, _write_key(key, folder / f"{name}.key"))


@dataclass
class TlsRedis:
    """``redis-server`` on a free loopback TLS port, no plain port, the ``keel`` ACL user."""

    home: Path
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    port: int = 0
    process: subprocess.Popen | None = None
    authority: Authority | None = None
    client_cert: Issued | None = None

    def start(self) -> None:
        program = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin")
        if program is None:
            raise AssertionError("redis-server is not installed (Debian: apt-get install redis)")
        self.home.mkdir(parents=True, exist_ok=True)
        self.authority = make_authority(self.home, "keel test redis ca")
        served = issue(self.authority, self.home, "redis-server", server=True)
        self.client_cert = issue(self.authority, self.home, "keel-client", server=False)
        self.port = free_port()
        argv = [
            program,
            "--port", "0",
            "--tls-port", str(self.port),
            "--bind", "127.0.0.1",
            "--tls-cert-file", str(served.cert),
            "--tls-key-file", str(served.key),
            "--tls-ca-cert-file", str(self.authority.cert),
            "--tls-auth-clients", "yes",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.home),
            "--logfile", str(self.home / "redis.log"),
            "--user", "default", "off",
            "--user", USER, "on", f">{self.password}", "~*", "&*", "+@all",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv,
            stdout=(self.home / "redis.out").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._answers, timeout=20, interval=0.05)

    def url(self, ca: Path | None = None, client_cert: bool = True) -> str:
        """``KEEL_REDIS_URL``: rediss://, the ACL user, the CA file (this server's, unless
        ``ca``) and the client certificate the server asks for."""
        assert self.authority is not None and self.client_cert is not None
        query = f"ssl_ca_certs={ca or self.authority.cert}"
        if client_cert:
            query += f"&ssl_certfile={self.client_cert.cert}&ssl_keyfile={self.client_cert.key}"
        return f"rediss://{USER}:{self.password}@127.0.0.1:{self.port}/0?{query}"

    def client(self) -> redis.Redis:
        assert self.authority is not None and self.client_cert is not None
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            username=USER,
            password=self.password,
            ssl=True,
            ssl_cert_reqs=ssl.CERT_REQUIRED,
            ssl_ca_certs=str(self.authority.cert),
            ssl_certfile=str(self.client_cert.cert),
            ssl_keyfile=str(self.client_cert.key),
            socket_timeout=2,
        )

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = self.home / "redis.log"
            raise AssertionError(
                f"redis-server exited:\n{log.read_text()[-2000:] if log.exists() else ''}"
            )
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

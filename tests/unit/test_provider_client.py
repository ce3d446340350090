"""The provider client reads the environment's proxy and CA settings once, when it is made."""

from __future__ import annotations

from tasks.notifications.provider import ProviderClient


def test_proxies_and_ca_bundle_from_the_environment_still_apply(monkeypatch):
    # Given an environment that routes HTTP through a proxy and names a CA bundle
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/keel-ca.pem")
    monkeypatch.setenv("KEEL_PROVIDER_URL", "http://provider.example:8025")
    from tasks.platform.config import forget_settings

    forget_settings()
    try:
        client = ProviderClient.from_settings()
    finally:
        forget_settings()
    # Then the session carries them, and no longer looks them up on every request
    assert client.session.proxies["http"] == "http://proxy.internal:3128"
    assert client.session.verify == "/etc/ssl/keel-ca.pem"
    assert client.session.trust_env is False


def test_no_proxy_when_the_environment_names_none(monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert "http" not in ProviderClient.from_settings().session.proxies

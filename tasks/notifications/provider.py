"""Client of the messaging provider's group API (the sandbox in dev and tests).

Timeouts on every call; 429, 5xx, timeouts and dropped connections raise
``ProviderUnavailable`` (retryable: the calling job backs off and runs
again); anything else unexpected raises ``ProviderRejected``. Responses are
validated, so a provider that changes shape fails loudly, not silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import requests
from pydantic import BaseModel, ValidationError
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from tasks.jobs.model.errors import KeelError, Unavailable
from tasks.platform.config import get_settings

# The provider's documented limits: messages per add request, characters per message.
MAX_MESSAGES_PER_REQUEST = 1000
MAX_TEXT_LENGTH = 10_000
# The provider sandbox's header for its admin key (its ledger is not a real provider's API).
SANDBOX_ADMIN_HEADER = "X-Sandbox-Admin-Key"
TIMEOUT = (2.0, 10.0)
# A few quick transport-level retries absorb isolated 503s and lost responses; every call is
# safe to repeat (stable message ids, idempotency keys on create, the provider refuses a
# second send). What is left over fails the job run, and the job's own backoff takes over.
TRANSPORT_RETRY = Retry(
    total=3,
    backoff_factor=0.05,
    status_forcelist=(429, 500, 502, 503, 504),
    allowed_methods=None,
    respect_retry_after_header=True,
    raise_on_status=False,
)


class ProviderUnavailable(Unavailable):
    """The provider did not answer usefully; retry later."""

    code = "provider_unavailable"


class ProviderRejected(KeelError):
    """The provider refused the request for good (``provider_status`` says how)."""

    code = "provider_rejected"

    def __init__(self, message: str, provider_status: int) -> None:
        super().__init__(message)
        self.provider_status = provider_status


class GroupConflict(ProviderRejected):
    """The group is already sent (or not empty, for a delete)."""


class _Created(BaseModel):
    groupId: str


class _Added(BaseModel):
    accepted: int
    duplicates: int = 0


class GroupStatus(BaseModel):
    groupId: str
    count: int
    sent: bool


@dataclass
class ProviderClient:
    """One provider endpoint; a ``requests.Session`` per client for connection reuse."""

    base_url: str
    session: requests.Session

    @classmethod
    def from_settings(cls) -> ProviderClient:
        url = get_settings().provider_url or "http://127.0.0.1:8025"
        session = requests.Session()
        session.mount("http://", HTTPAdapter(max_retries=TRANSPORT_RETRY))
        session.mount("https://", HTTPAdapter(max_retries=TRANSPORT_RETRY))
        # What requests would read from the environment on every call (proxies, a CA
        # bundle), read once: a campaign makes a thousand requests a second, and the
        # per-call lookup cost more than building the request.
        session.proxies.update(requests.utils.get_environ_proxies(url))
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle:
            session.verify = bundle
        session.trust_env = False
        return cls(url.rstrip("/"), session)

    def _call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> requests.Response:
        try:
            response = self.session.request(
                method, self.base_url + path, json=body, headers=headers, timeout=TIMEOUT
            )
        except requests.RequestException as exc:
            raise ProviderUnavailable(f"{method} {path}: {type(exc).__name__}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise ProviderUnavailable(f"{method} {path}: HTTP {response.status_code}")
        if response.status_code == 409:
            raise GroupConflict(f"{method} {path}: {response.text[:200]}", 409)
        if response.status_code >= 400:  # the provider refuses this request for good
            raise ProviderRejected(
                f"{method} {path}: HTTP {response.status_code} {response.text[:200]}",
                response.status_code,
            )
        return response

    @staticmethod
    def _parse(model: type[BaseModel], response: requests.Response) -> Any:
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError) as exc:
            raise ProviderUnavailable(f"malformed provider response: {exc}") from exc

    def create_group(self, name: str, idempotency_key: str) -> str:
        """A new group; a retry with the same key gets the same group, not an orphan."""
        response = self._call(
            "POST", "/v1/groups", {"name": name}, headers={"Idempotency-Key": idempotency_key}
        )
        return self._parse(_Created, response).groupId

    def add_messages(self, group_id: str, messages: list[dict[str, str]]) -> int:
        if len(messages) > MAX_MESSAGES_PER_REQUEST:
            raise ValueError(f"at most {MAX_MESSAGES_PER_REQUEST} messages per request")
        response = self._call("POST", f"/v1/groups/{group_id}/messages", {"messages": messages})
        return self._parse(_Added, response).accepted

    def send(self, group_id: str) -> None:
        self._call("POST", f"/v1/groups/{group_id}/send")

    def status(self, group_id: str) -> GroupStatus:
        return self._parse(GroupStatus, self._call("GET", f"/v1/groups/{group_id}"))

    def delete_group(self, group_id: str) -> None:
        self._call("DELETE", f"/v1/groups/{group_id}")

    def ledger(self, **params: str) -> dict[str, Any]:
        """The sandbox's ledger (not a real provider's API): needs ``KEEL_SANDBOX_ADMIN_KEY``."""
        headers = {SANDBOX_ADMIN_HEADER: get_settings().sandbox_admin_key}
        try:
            response = self.session.get(
                self.base_url + "/v1/ledger", params=params, headers=headers, timeout=60
            )
        except requests.RequestException as exc:
            raise ProviderUnavailable(f"ledger: {exc}") from exc
        response.raise_for_status()
        return response.json()

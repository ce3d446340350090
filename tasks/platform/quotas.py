"""Per-tenant quotas (``KEEL_TENANT_QUOTAS``, JSON), with defaults sized for one busy tenant.

The fields, their defaults and what each refuses are
``tasks.platform.setting_types.TenantQuotas``'s;
the value is parsed (and a malformed one refused, naming the variable) when the settings
are read, at every process's start.
"""

from __future__ import annotations

from tasks.platform.config import get_settings
from tasks.platform.setting_types import TenantQuotas


def current() -> TenantQuotas:
    """The tenants' quotas (``KEEL_TENANT_QUOTAS``, parsed when the settings were read)."""
    quotas: TenantQuotas = get_settings().tenant_quotas
    return quotas

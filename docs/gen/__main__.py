"""``python -m docs.gen [--check]``: write the generated reference pages, or check them.

Run from the checkout's root folder. The pages describe Keel as it ships, not
as this machine is configured: every ``KEEL_*`` variable of the caller is
dropped first, and a stack's ``$KEEL_HOME/env`` is out of reach (an empty home).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A key for the app factory's check only: nothing is signed with it.
PLACEHOLDER_SECRET = "docs-generation-placeholder-secret-0123456789"


def _neutral_environment(home: str) -> None:
    for name in [n for n in os.environ if n.startswith(("KEEL_", "OTEL_"))]:
        del os.environ[name]
    os.environ["KEEL_HOME"] = home
    os.environ["KEEL_SECRET_KEY"] = PLACEHOLDER_SECRET


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.gen", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page differs"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="keel-docs-") as home:
        _neutral_environment(home)
        # Imported only now: importing Keel reads the environment.
        from docs.gen.pages import PAGES
        from docs.gen.settings import Undocumented

        stale = []
        for relative, render in PAGES.items():
            path = ROOT / relative
            try:
                text = render()
            except Undocumented as exc:
                print(f"{relative}: {exc}", file=sys.stderr)
                return 2
            current = path.read_text() if path.exists() else None
            if current == text:
                continue
            stale.append(relative)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if args.check and stale:
        print(
            "out of date (run `python -m docs.gen` and commit the result): " + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    for relative in stale:
        print(f"wrote {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

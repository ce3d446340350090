"""``python -m provider_sandbox [--host H] [--port P] [--home DIR]``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from provider_sandbox import config
from provider_sandbox.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m provider_sandbox",
        description="A fake messaging provider's group API, for dev and tests.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=config.port(), help="default KEEL_SANDBOX_PORT")
    parser.add_argument("--home", type=Path, help="data folder, default $KEEL_HOME/sandbox")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    serve(args.host, args.port, args.home or config.home())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m agent_sidecar``."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())

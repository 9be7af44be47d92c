"""``python -m agent_sidecar``. The guard matters: spawned workers re-import the
parent's main module (as ``__mp_main__``) and must not run the CLI again."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())

"""Let the tests import the _client_fakes helper module beside them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

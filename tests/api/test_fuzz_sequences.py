"""The RPCs in odd orders on one sidecar, on the run's backend
(helpers/fuzz_sequences.py says what is called and what is asserted).

Bounded and reproducible: STEPS calls per seed, the seed in the test id.
"""

from __future__ import annotations

import pytest
from helpers import fuzz_sequences as fz
from sidecar_proc import Sidecar

STEPS = 200
SEEDS = [1, 2, 3]


@pytest.fixture(scope="module")
def fuzz_sc(tmp_path_factory):
    sc = Sidecar(tmp_path_factory.mktemp("fuzzseq") / "data", config=fz.CONFIG).start()
    with fz.tool_host(sc):
        yield sc
    sc.stop()
    print("\nsequence fuzz calls by rpc and status:", dict(sorted(fz.COUNTS.items(), key=str)))


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_call_sequences(fuzz_sc, seed):
    fz.run([fuzz_sc], seed, STEPS)
    fz.assert_clean([fuzz_sc])

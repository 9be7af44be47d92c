"""The RPCs in odd orders on a cluster of two nodes sharing one PostgreSQL
(helpers/fuzz_sequences.py): each call on either node, so lane calls are
forwarded to the lane's holder and frames followed through the cluster tail;
the same promises as on one sidecar.
"""

from __future__ import annotations

import pytest
from helpers import fuzz_sequences as fz
from helpers.cluster import Cluster

STEPS = 200
SEEDS = [1, 2]


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory, cluster_databases):
    with Cluster(tmp_path_factory.mktemp("fuzzcl"), cluster_databases(), n=2, config=fz.CONFIG) as cl:
        with fz.tool_host(cl[0]):
            yield list(cl)


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_call_sequences_on_a_cluster(fuzz_cluster, seed):
    fz.run(fuzz_cluster, seed, STEPS)
    fz.assert_clean(fuzz_cluster)

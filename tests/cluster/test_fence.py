"""The fence at the store: a write made under a lane's old epoch is refused,
whichever node sends it, with nothing of it written (docs/cluster.md,
"Fencing"; issue 16).

From outside (test_leases.py) a stalled node that wakes up may notice its
lost lease through its renewal before it writes anything, so whether the
fence refuses a write there is a race; here each node's write is a frame
flush (turns/flush.py run_flush, the job every turn's frames and transcript
rows go through) run on a real PostgreSQL as that node, under the epoch it
believes it holds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers.ids import uniq
from helpers.store import local_store

from agent_sidecar.cluster import jobs
from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.store.records import Append, Message
from agent_sidecar.turns import flush
from agent_sidecar.turns.leasing import LeaseLost

HOW = jobs.Restoring(3600, "off")
TTL = 60.0


def _flush_line(s, node: str, key: str, sid: str, epoch: int, text: str) -> None:
    """As ``node``: one transcript row of ``sid``, flushed under ``epoch``."""
    s.uow.node_id = node
    no = flush._FlushOrder.ran + 1
    row = Append(sid, (Message(role="assistant", content=text),), request_id=f"r-{uniq()}")
    s.job(flush.run_flush, (no, no - 1), [], [(flush.MSG, row)], {key: epoch})
    flush._FlushOrder.committed = no  # what the writer process does after the COMMIT


@pytest.fixture
def lane(cluster_dsn):
    """A store on the cluster's database and a lane of it: (store, key, session id)."""
    with local_store(SimpleNamespace(store_dsn=cluster_dsn)) as s:
        key = f"agent:main:telegram:dm:{uniq()}"
        entry, _ = s.job(life.get_or_create, key, SessionSource("telegram", chat_id=key), "main")
        yield s, key, entry.session_id


def _lines(s, sid: str) -> list[str]:
    return [m.content for m in s.read("transcript", sid, False, 0, None)]


def test_a_write_under_the_epoch_before_a_takeover_is_refused_and_writes_nothing(lane):
    s, key, sid = lane
    s.uow.node_id = "a"
    old = s.job(jobs.take_lane, key, "addr-a", TTL, HOW).lease.epoch
    _flush_line(s, "a", key, sid, old, "a, while it held the lane")
    # a stalls past its lease: it runs out, and b takes the lane.
    s.job(lambda uow: uow.leases.expire(key, "a", old))
    s.uow.node_id = "b"
    new = s.job(jobs.take_lane, key, "addr-b", TTL, HOW).lease.epoch
    assert new > old
    # a wakes up and flushes what its worker streamed meanwhile.
    with pytest.raises(LeaseLost) as refused:
        _flush_line(s, "a", key, sid, old, "a, after the takeover")
    assert refused.value.epochs == {key: old} and refused.value.revoked == frozenset()
    # b's own write, at its epoch, goes through; even a at b's epoch would not.
    _flush_line(s, "b", key, sid, new, "b, holding the lane")
    with pytest.raises(LeaseLost):
        _flush_line(s, "a", key, sid, new, "a, guessing the new epoch")
    assert _lines(s, sid) == ["a, while it held the lane", "b, holding the lane"]


def test_a_write_on_a_lane_whose_lease_a_delete_revoked_is_refused_as_revoked(lane):
    s, key, sid = lane
    s.uow.node_id = "a"
    held = s.job(jobs.take_lane, key, "addr-a", TTL, HOW).lease.epoch
    s.job(lambda uow: uow.leases.revoke([key]))  # what DeleteSession's job does to the lease
    with pytest.raises(LeaseLost) as refused:
        _flush_line(s, "a", key, sid, held, "a, after the delete")
    assert refused.value.epochs == {key: held} and refused.value.revoked == frozenset({key})
    assert _lines(s, sid) == []

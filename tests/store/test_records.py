"""The values that cross the storage seam (store/records.py): a ``@record``
is frozen, takes its fields positionally or by name with the dataclass's
defaults (a default factory gives each instance its own value), and comes
back from the writer pipe equal to what was sent; so does a transcript
``Message``, which is not frozen."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from agent_sidecar.store.records import Append, Message
from agent_sidecar.turns.jobs import AcceptRequest, PromptRecord, TurnEnd

pytestmark = pytest.mark.store_free("the storage seam's value types, in-process")


def prompt() -> PromptRecord:
    return PromptRecord("r1", "agent:main:telegram:dm:1", "telegram", "main", 3, "hi", {"a": [1]}, 1.5)


def test_a_record_is_frozen():
    p = prompt()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.text = "changed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.text
    assert p.text == "hi"


def test_a_record_takes_its_fields_by_position_or_name_with_defaults():
    req = AcceptRequest(prompt(), None, 300.0, None, 2, True)
    assert req.fence is None and req.position == 2
    assert AcceptRequest(prompt=prompt(), source=None, dedup_window_s=300.0, slot="fifo",
                         position=0, start_now=False, fence={"k": 1}).fence == {"k": 1}
    with pytest.raises(TypeError):
        AcceptRequest(prompt(), None)
    a = TurnEnd("r", "k", "s", "completed", "", 5, False, True)
    b = TurnEnd("r", "k", "s", "completed", "", 5, False, True)
    assert a.state == {} and a.state is not b.state  # the factory's value, one per instance


@pytest.mark.parametrize("value", [
    AcceptRequest(prompt(), None, 300.0, "pending", 1, False, {"agent:main:telegram:dm:1": 3}),
    TurnEnd("r", "k", "s", "failed", "CANCELLED", 7, True, False, {"usage": {"input_tokens": 2}}),
    Append("sid", (Message("assistant", "hello", tool_calls_json="[]", created_at=2.5, synthetic=True),
                   Message("tool", "{}", tool_call_id="c1", tool_name="t")), "r", touch_lane=False),
])
def test_values_cross_the_pipe_unchanged(value):
    back = pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == value and type(back) is type(value)
    assert [dataclasses.asdict(m) for m in getattr(back, "messages", ())] == \
        [dataclasses.asdict(m) for m in getattr(value, "messages", ())]

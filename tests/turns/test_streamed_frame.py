"""A committed frame is encoded once for every stream that carries it
(turns/subscriber.py ``StreamedFrame``): its ``wire`` bytes must be exactly the
PromptResponse and the WatchActivityResponse holding it, whatever the
frame's size (the length prefix is a varint of one, two, three or more
bytes), and ``size`` exactly the frame's encoded size."""

from __future__ import annotations

import pytest

from agent_sidecar.turns.frames import build_frame
from agent_sidecar.turns.subscriber import StreamedFrame
from agent_sidecar.v1 import prompt_service_pb2 as ppb

pytestmark = pytest.mark.store_free("a frame's wire encoding, in-process")


def frame_of(text: str):
    return build_frame("r-1", "agent:main:t:dm:u", "s-1", 3, 1_700_000_000.25, 42, "text_delta",
                       {"text": text})


@pytest.mark.parametrize("nbytes", [0, 1, 40, 60, 100, 16_300, 16_400, 2_100_000])
def test_the_wire_bytes_are_both_responses_of_the_frame(nbytes):
    frame = frame_of("é" * (nbytes // 2) + "x" * (nbytes % 2))  # é: two bytes
    item = StreamedFrame(frame)
    assert item.wire == ppb.PromptResponse(frame=frame).SerializeToString()
    assert item.wire == ppb.WatchActivityResponse(frame=frame).SerializeToString()
    assert item.size == frame.ByteSize()
    assert ppb.PromptResponse.FromString(item.wire).frame == frame


def test_the_length_prefix_crosses_each_varint_width():
    """The sizes above straddle 127/128, 16,383/16,384 and 2,097,151/2,097,152 bytes."""
    widths = {len(StreamedFrame(frame_of("x" * n)).wire) - frame_of("x" * n).ByteSize() - 1
              for n in (0, 60, 100, 16_300, 16_400, 2_100_000)}
    assert widths == {1, 2, 3, 4}

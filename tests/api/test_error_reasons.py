"""Every reason the server can send is declared in the proto's ErrorReason enum,
with the gRPC status the server pairs it with (docs/api.md, "Error reasons").

The server's reasons are the string constants of agent_sidecar.errors plus
every key of api/errors.py's CODE_FOR_REASON (which also maps the lower-case
recovery reasons); the proto's are ErrorReason's values, whose wire string is
the name without ERROR_REASON_ compared case-insensitively, and whose comment
ends with "gRPC status: CODE". A reason added to errors.py without its enum
value, or with a different code, fails here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agent_sidecar import errors as E
from agent_sidecar.api.errors import CODE_FOR_REASON
from agent_sidecar.v1 import error_reason_pb2

pytestmark = pytest.mark.store_free("the error reasons of the code and the proto")

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "ERROR_REASON_"


def _generator():
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "docs/gen/api_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _server_reasons() -> set[str]:
    consts = {v for k, v in vars(E).items() if k.isupper() and isinstance(v, str) and k != "DOMAIN"}
    return consts | set(CODE_FOR_REASON)


def _declared() -> dict[str, tuple[str, str]]:
    """Wire string (upper-cased) → (enum value name, gRPC code from its comment)."""
    gen = _generator()
    fds = gen.load_descriptors()
    f = next(f for f in fds.file if f.name == "agent_sidecar/v1/error_reason.proto")
    comments = gen.Comments(f)
    (ei, enum), = [(i, e) for i, e in enumerate(f.enum_type) if e.name == "ErrorReason"]
    out = {}
    for vi, v in enumerate(enum.value):
        if v.number == 0:
            continue
        text = comments.get(gen.FILE_ENUM, ei, gen.ENUM_VALUE, vi)
        code = gen.STATUS_LINE.search(text)
        out[gen.wire_reason(v.name, text).upper()] = (v.name, code.group(1) if code else "")
    return out


def test_every_server_reason_is_declared_with_its_grpc_code():
    declared = _declared()
    missing = sorted(r for r in _server_reasons() if r.upper() not in declared)
    assert not missing, f"reasons the server sends but proto/…/error_reason.proto does not declare: {missing}"
    wrong = {r: (CODE_FOR_REASON[r].name, declared[r.upper()][1])
             for r in CODE_FOR_REASON if CODE_FOR_REASON[r].name != declared[r.upper()][1]}
    assert not wrong, f"gRPC code in CODE_FOR_REASON vs the enum comment: {wrong}"


def test_every_declared_reason_is_one_the_server_knows():
    """No stale enum value: each declared reason has a gRPC code on the server."""
    server = {r.upper() for r in CODE_FOR_REASON}
    stale = sorted(name for wire, (name, _) in _declared().items() if wire not in server)
    assert not stale, f"ErrorReason values the server never maps to a status: {stale}"


def test_wire_string_is_the_value_name_without_the_prefix():
    """The rule clients rely on, checked on the generated code itself."""
    names = {n for n in error_reason_pb2.ErrorReason.keys() if n != PREFIX + "UNSPECIFIED"}
    assert all(n.startswith(PREFIX) for n in names)
    assert {n[len(PREFIX):] for n in names} == set(_declared())
    assert error_reason_pb2.ErrorReason.Name(error_reason_pb2.ERROR_REASON_AGENT_BUSY)[len(PREFIX):] == E.AGENT_BUSY

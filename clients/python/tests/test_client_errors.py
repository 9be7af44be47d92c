"""Error decoding: a google.rpc.Status with ErrorInfo becomes the typed exception."""

import grpc
from _client_fakes import FakeRpcError, status_trailers
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

import agent_sidecar_client as asc
from agent_sidecar_client import errors


def test_agent_busy_with_retry_info():
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000))
    exc = FakeRpcError(grpc.StatusCode.ABORTED, "busy",
                       status_trailers(grpc.StatusCode.ABORTED, "AGENT_BUSY", "a turn is in flight", retry))
    err = errors.from_rpc_error(exc)
    assert isinstance(err, asc.AgentBusy) and isinstance(err, asc.SidecarError)
    assert (err.code, err.reason, err.message) == (grpc.StatusCode.ABORTED, "AGENT_BUSY", "a turn is in flight")
    assert err.retry_delay == 1.5
    assert err.__cause__ is exc


def test_invalid_argument_field_violations():
    bad = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="request_id", description="required")])
    exc = FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "",
                       status_trailers(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "bad", bad))
    err = errors.from_rpc_error(exc)
    assert isinstance(err, asc.InvalidArgument)
    assert err.field_violations == [("request_id", "required")]


def test_every_reason_maps_to_its_class():
    for reason, cls in errors.BY_REASON.items():
        exc = FakeRpcError(cls.default_code, "x", status_trailers(cls.default_code, reason, "m"))
        err = errors.from_rpc_error(exc)
        assert type(err) is cls and err.reason == reason and err.code == cls.default_code


def test_aio_style_metadata_object():
    trailers = grpc.aio.Metadata(*status_trailers(grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND", "gone"))
    err = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "gone", trailers))
    assert isinstance(err, asc.SessionNotFound) and err.message == "gone"


def test_no_error_info_no_reason():
    """A reason is only ever the sidecar's: a status without its ErrorInfo gets
    none (the client used to invent UNAUTHENTICATED, PERMISSION_DENIED,
    INVALID_ARGUMENT and, for its own deadline, AGENT_TIMEOUT)."""
    for code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                 grpc.StatusCode.INVALID_ARGUMENT):
        err = errors.from_rpc_error(FakeRpcError(code, "no token"))
        assert type(err) is asc.SidecarError and err.reason == "" and err.code == code
    err = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    assert type(err) is asc.DeadlineExceeded and err.reason == "" and not isinstance(err, asc.AgentTimeout)
    err = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNIMPLEMENTED, "later"))
    assert type(err) is asc.SidecarError and err.reason == "" and err.code == grpc.StatusCode.UNIMPLEMENTED
    assert not errors.has_error_info(FakeRpcError(grpc.StatusCode.UNAVAILABLE))


def test_unknown_reason_is_base_class_keeping_reason():
    exc = FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "",
                       status_trailers(grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION", "confirm"))
    err = errors.from_rpc_error(exc)
    assert type(err) is asc.FailedPrecondition and err.reason == "FAILED_PRECONDITION"
    assert errors.has_error_info(exc)
    exc = FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "",
                       status_trailers(grpc.StatusCode.FAILED_PRECONDITION, "SOMETHING_NEW", "confirm"))
    err = errors.from_rpc_error(exc)
    assert type(err) is asc.SidecarError and err.reason == "SOMETHING_NEW"


def test_failed_frame_error():
    err = errors.from_failed_frame("TOOL_SCOPE_VIOLATION", "other.x")
    assert isinstance(err, asc.ToolScopeViolation) and err.code == grpc.StatusCode.PERMISSION_DENIED
    err = errors.from_failed_frame("SOMETHING_NEW", "m")
    assert type(err) is asc.SidecarError and err.reason == "SOMETHING_NEW"
    # The lower-case reasons of docs/semantics.md's table have their code too.
    err = errors.from_failed_frame("restart_interrupted", "m")
    assert type(err) is asc.RestartInterrupted and err.code == grpc.StatusCode.UNAVAILABLE
    assert errors.from_failed_frame("shutdown_timeout", "m").code == grpc.StatusCode.UNAVAILABLE


def test_garbled_trailer_is_ignored():
    exc = FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "no", (("grpc-status-details-bin", b"\xff\xff"),))
    err = errors.from_rpc_error(exc)
    assert type(err) is asc.SidecarError and err.code == grpc.StatusCode.PERMISSION_DENIED and err.reason == ""


def _foreign_status(code: grpc.StatusCode, reason: str, *extra) -> grpc.Status:
    """A grpc.Status whose ErrorInfo comes from another domain (a proxy's)."""
    details = []
    for msg in (error_details_pb2.ErrorInfo(reason=reason, domain="envoy.example.com",
                                            metadata={"upstream": "x"}), *extra):
        packed = any_pb2.Any()
        packed.Pack(msg)
        details.append(packed)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message="upstream connect error",
                                                  details=details))


def test_foreign_domain_error_info_is_not_a_sidecar_reason():
    st = _foreign_status(grpc.StatusCode.UNAVAILABLE, "CANCELLED")
    exc = FakeRpcError(st.code, st.details, st.trailing_metadata)
    err = errors.from_rpc_error(exc)
    assert type(err) is asc.SidecarError and err.reason == "" and err.metadata == {}
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.message == "upstream connect error"
    assert not errors.has_error_info(exc)  # a transport error: resumable
    # Without a sidecar reason there is no reason, as with no ErrorInfo at all.
    st = _foreign_status(grpc.StatusCode.PERMISSION_DENIED, "AGENT_BUSY")
    err = errors.from_rpc_error(FakeRpcError(st.code, st.details, st.trailing_metadata))
    assert type(err) is asc.SidecarError and err.reason == ""


def test_sidecar_error_info_wins_over_a_foreign_one():
    ours = error_details_pb2.ErrorInfo(reason="AGENT_BUSY", domain=errors.DOMAIN)
    st = _foreign_status(grpc.StatusCode.ABORTED, "CANCELLED", ours)
    exc = FakeRpcError(st.code, st.details, st.trailing_metadata)
    assert isinstance(errors.from_rpc_error(exc), asc.AgentBusy)
    assert errors.has_error_info(exc)


def test_every_typed_error_reason_is_declared_in_the_proto():
    from agent_sidecar_client import ErrorReason
    from agent_sidecar_client.errors import BY_REASON
    declared = {name.removeprefix("ERROR_REASON_") for name in ErrorReason.keys()}
    declared |= {"restart_interrupted", "shutdown_timeout"}  # sent in lower case (docs/semantics.md)
    assert set(BY_REASON) <= declared, set(BY_REASON) - declared

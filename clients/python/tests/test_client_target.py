"""A target gRPC can never dial is refused when the client is made (no
sidecar needed): a Unix socket path longer than the 107 bytes a sockaddr_un
holds. Before, connect() waited its whole timeout and raised UNAVAILABLE "no
sidecar reachable", after gRPC's C-core dumped "Path name should not have more
than 107 characters" to stderr."""

import asyncio
import time

import pytest

import agent_sidecar_client as asc

D = "/tmp/"  # 5 bytes


def make(target: str, *, via_connect: bool) -> None:
    async def run() -> None:
        if via_connect:
            client = await asc.connect(target, timeout=5)
        else:
            client = asc.SidecarClient(target)
        await client.close()
    asyncio.run(run())


@pytest.mark.parametrize("via_connect", [True, False])
@pytest.mark.parametrize(("target", "n"), [
    ("unix:" + D + "s" * 110, 115),
    ("unix:" + D + "s" * 103, 108),  # one byte too many
    ("unix:///tmp/" + "s" * 103, 108),  # the path is /tmp/sss…
    ("unix:" + "s" * 108, 108),  # relative
    ("unix:" + D + "é" * 52, 109),  # bytes of UTF-8, not characters (57 of them)
    ("unix:" + D + "s" * 100 + "%41%42%43", 108),  # gRPC decodes percent-escapes
    ("unix-abstract:" + "s" * 108, 108),
])
def test_a_unix_socket_path_past_107_bytes_is_refused_at_once(target, n, via_connect, capfd):
    start = time.monotonic()
    with pytest.raises(ValueError) as e:
        make(target, via_connect=via_connect)
    assert str(e.value) == f"target: a Unix socket path may be at most 107 bytes; this one is {n}"
    assert time.monotonic() - start < 2
    assert "107 characters" not in capfd.readouterr().err  # gRPC never saw it


@pytest.mark.parametrize("target", [
    "unix:" + D + "s" * 102,  # exactly 107 bytes
    "unix:///tmp/" + "s" * 102,
    "unix:" + "s" * 107,
    "unix:" + D + "é" * 51,  # 107 bytes
    "unix:" + D + "s" * 99 + "%41%42%43",  # 107 once decoded
    "unix-abstract:" + "s" * 107,
    "localhost:50051",
])
def test_a_path_of_107_bytes_or_another_target_is_accepted(target):
    make(target, via_connect=False)


def test_a_unix_target_with_an_authority_dials_its_path(tmp_path):
    """unix://localhost/PATH was taken as it was, and gRPC's core refuses to
    dial it ("authority-based URIs not supported by the unix scheme"): it is
    the socket at PATH, as in the Go and Node clients."""
    from agent_sidecar_client._args import normalize_target
    assert normalize_target("unix://localhost/tmp/s.sock") == "unix:/tmp/s.sock"
    assert normalize_target("unix:///tmp/s.sock") == "unix:/tmp/s.sock"
    assert normalize_target("unix:./data/sidecar.sock") == "unix:./data/sidecar.sock"



@pytest.mark.parametrize("via_connect", [True, False])
@pytest.mark.parametrize("form", ["{}", "unix:{}", "unix://{}"])
def test_a_directory_is_refused_at_once_naming_it(tmp_path, form, via_connect):
    """A directory given as the socket (the sidecar's data dir, whose socket is
    sidecar.sock inside it) is refused when the client is made, as the Go
    client refuses it. Before, connect() waited its whole timeout and raised
    UNAVAILABLE "no sidecar reachable", and a client made without waiting
    failed every call UNAVAILABLE."""
    start = time.monotonic()
    with pytest.raises(ValueError) as e:
        make(form.format(tmp_path), via_connect=via_connect)
    assert str(e.value).startswith(f"target: {tmp_path} is a directory, not a socket"), str(e.value)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("target, scheme", [("ipv4:127.0.0.1:1", "ipv4"), ("ipv6:[::1]:1", "ipv6"),
                                            ("IPv4:127.0.0.1:1", "IPv4")])
def test_grpcs_own_address_schemes_are_named_as_such(target, scheme):
    """gRPC's ipv4:/ipv6: targets: a scheme the client does not dial, said so;
    before, ipv4:127.0.0.1:1 (its host read as "ipv4") was told that an IPv6
    address goes in brackets."""
    with pytest.raises(ValueError) as e:
        asc.SidecarClient(target)
    assert str(e.value).startswith(f"target: {target!r} has gRPC's {scheme}: scheme, which this client does "
                                   "not dial: give the address alone (host:port, [v6]:port)"), str(e.value)

"""The client's TLS options and its cleartext rule (no sidecar needed: the
refusals come before any connection; TLS against a real sidecar is tested in
tests/api/test_tls.py)."""

import asyncio

import pytest

import agent_sidecar_client as asc
from agent_sidecar_client._tls import is_local_target


def open_client(target: str, token: str | None = "tok", **kw) -> None:
    async def run() -> None:
        client = await asc.connect(target, token, wait_ready=False, **kw)
        await client.close()
    asyncio.run(run())


@pytest.mark.parametrize("target", ["10.1.2.3:50051", "sidecar.internal:50051", "0.0.0.0:50051",
                                    "dns:///sidecar.internal:50051", "[2001:db8::1]:50051"])
def test_a_token_is_refused_on_a_plain_channel_to_another_host(target):
    with pytest.raises(ValueError, match="refusing to send the bearer token in cleartext"):
        open_client(target)
    open_client(target, insecure=True)  # said so: sent plain
    open_client(target, tls=True)  # TLS: sent encrypted
    open_client(target, token=None)  # no token: nothing to protect


@pytest.mark.parametrize("target", ["unix:./data/sidecar.sock", "unix:///run/s.sock", "127.0.0.1:50051",
                                    "127.8.9.10:1", "localhost:50051", "[::1]:50051"])
def test_a_token_may_go_plain_where_nothing_leaves_the_machine(target):
    assert is_local_target(target)
    open_client(target)


@pytest.mark.parametrize("flag", ["insecure", "tls"])
def test_a_flag_that_is_no_bool_is_refused_naming_it(flag):
    # insecure="false" is truthy: it sent the token in cleartext to another host
    with pytest.raises(ValueError, match=f"^{flag}: 'false'; True or False"):
        open_client("10.1.2.3:50051", **{flag: "false"})


def test_a_client_certificate_needs_its_key():
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        open_client("127.0.0.1:1", cert_file=b"-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize("option", ["ca_file", "cert_file"])
def test_an_empty_path_is_refused_naming_its_option(option):
    """An unset variable gives "": before, FileNotFoundError "No such file or
    directory: ''" named no option (the Go client's WithCAFile("") fell back
    to the system's roots; the Node client refuses it naming caFile)."""
    files = {"ca_file": ""} if option == "ca_file" else {"cert_file": "", "key_file": ""}
    with pytest.raises(ValueError, match=f"^{option}: an empty path"):
        open_client("127.0.0.1:1", **files)

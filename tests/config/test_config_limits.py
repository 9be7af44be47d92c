"""The config loader against hostile or careless input: files named by the
config that are devices, FIFOs or huge (refused, never read without end),
numbers beyond a float or 64 bits, strings that are no UTF-8, a config file
that is no UTF-8 or nests without end, a worker count no host runs, listen
addresses that would fail only at serve time, and an environment value
holding more than one TOML value. Each is one ``config error:`` line naming
its key, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.cli import CLEAN_ENV, COMMAND, cli
from sidecar_proc import ROOT
from test_config import load, names, problems

HUGE = 10**400


def check(tmp_path, text: str | None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``agent-sidecar config check`` of ``text`` (None: of /dev/zero), in 1 GiB
    of address space and 20 s (a loader reading /dev/zero fails fast instead
    of eating the host)."""
    path = tmp_path / "c.toml"
    if text is None:
        path = "/dev/zero"
    else:
        path.write_text(text)

    # The cap is set by a small program that then becomes the command, not by a
    # preexec_fn: that runs in a fork of this test process, whose gRPC threads'
    # fork handlers could abort the child before its exec (SIGABRT, "epoll_wait
    # error: Bad file descriptor" on its stderr).
    return subprocess.run([sys.executable, "-c", _CAPPED, *COMMAND, "config", "check", str(path)],
                          capture_output=True, text=True, timeout=20, cwd=ROOT, env={**CLEAN_ENV, **(env or {})})


_CAPPED = ("import os, resource, shutil, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
           " os.execv(shutil.which(sys.argv[1]) or sys.argv[1], sys.argv[1:])")


def refused(r: subprocess.CompletedProcess) -> list[str]:
    """The problems of a check that refused the config, each one line."""
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stderr[-2000:])
    said = r.stderr.splitlines()  # each line after its command's prefix (cli/report.py)
    assert said and all(line.startswith(("agent-sidecar config: ", "agent-sidecar serve: ")) for line in said), said
    lines = [line.split(": ", 1)[1] for line in said]
    assert all(line.startswith("config error: ") for line in lines), lines
    return lines


# -- files the config names ------------------------------------------------------------------------

FILE_KEYS = {
    "auth.tokens[0].token_file": "[[auth.tokens]]\ntoken_file = \"{f}\"\n",
    "store.dsn_file": "[store]\ndsn_file = \"{f}\"\n",
    "listen[0].cert": "[[listen]]\naddress = \"unix:/tmp/x.sock\"\ncert = \"{f}\"\nkey = \"{f}\"\n",
    "listen[0].client_ca": "[[listen]]\naddress = \"unix:/tmp/x.sock\"\nclient_ca = \"{f}\"\n",
    "cluster.ca_file": "[cluster]\nca_file = \"{f}\"\n",
    "cluster.key_file": "[cluster]\nkey_file = \"{f}\"\n",
}


@pytest.fixture
def odd_files(tmp_path):
    """A FIFO no one writes (opening it blocks), and a sparse file of 1 GiB."""
    fifo, big = tmp_path / "fifo", tmp_path / "big"
    os.mkfifo(fifo)
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    return {"/dev/zero": "is not a regular file", str(fifo): "is not a regular file", str(big): "is larger than"}


@pytest.mark.parametrize("key", list(FILE_KEYS))
def test_a_named_file_that_is_no_regular_file_or_huge_is_refused_naming_the_key(tmp_path, odd_files, key):
    for path, what in odd_files.items():
        lines = refused(check(tmp_path, FILE_KEYS[key].format(f=path)))
        assert key in names(lines), lines
        line = lines[names(lines).index(key)]
        assert f"{key}: {path} {what}" in line, line


def test_named_files_of_a_sane_size_still_load(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("t" * 1000 + "\n")
    assert load(tmp_path, f'[[auth.tokens]]\ntoken_file = "{secret}"\n').tokens[0].token == "t" * 1000


# -- numbers and strings ---------------------------------------------------------------------------

def test_an_integer_beyond_a_float_is_no_finite_number(tmp_path):
    lines = problems(tmp_path, f"[agent]\ngateway_timeout = {HUGE}\n")
    assert names(lines) == ["agent.gateway_timeout"] and "expected a finite number" in lines[0]
    lines = problems(tmp_path, "", {"AGENT_SIDECAR_AGENT__GATEWAY_TIMEOUT": str(HUGE)})
    assert names(lines) == ["agent.gateway_timeout"] and "expected a finite number" in lines[0]
    assert lines[0].endswith("[from AGENT_SIDECAR_AGENT__GATEWAY_TIMEOUT]")
    assert load(tmp_path, f"[agent]\ngateway_timeout = {2**70}\n").gateway_timeout == float(2**70)


def test_integers_beyond_64_bits_are_refused_naming_the_key(tmp_path):
    lines = problems(tmp_path, "[profiles.main]\nmax_iterations = 18446744073709551616\n"
                               "model_options = { x = 100000000000000000000000000000, "
                               "y = [1, { z = -9223372036854775809 }] }\n"
                               "[agent.agent_cache]\nmemory_high_mb = 9223372036854775808\n"
                               f"[sidecar]\nhome_channels = {{ t = {{ id = {HUGE} }} }}\n")
    assert sorted(names(lines)) == ["agent.agent_cache.memory_high_mb", "profiles.main.max_iterations",
                                    "profiles.main.model_options.x", "profiles.main.model_options.y[1].z",
                                    "sidecar.home_channels.t.id"], lines
    assert all("must fit in 64 bits" in line for line in lines), lines
    cfg = load(tmp_path, "[profiles.main]\nmax_iterations = 9223372036854775807\nmodel = \"scripted\"\n"
                         "model_options = { steps = [{ usage = { input_tokens = -9223372036854775808 } }] }\n")
    assert cfg.profiles["main"].max_iterations == 2**63 - 1


def test_a_free_table_nested_too_deeply_is_refused(tmp_path):
    deep = "[" * 40 + "]" * 40
    lines = problems(tmp_path, f"[profiles.main]\nmodel_options = {{ a = {deep} }}\n")
    assert len(lines) == 1 and lines[0].startswith("config error: profiles.main.model_options.a[0]")
    assert "nested too deeply" in lines[0]


def test_strings_that_are_no_utf8_are_refused_naming_the_key(tmp_path):
    env = {"AGENT_SIDECAR_PROFILES__MAIN__SYSTEM_PROMPT": "hi\udcff",  # os.environ's form of b"hi\xff"
           "AGENT_SIDECAR_PROFILES__MAIN__MODEL_OPTIONS": '{ "k\udcff" = 1, s = ["a\udcff"] }',
           "AGENT_SIDECAR_SIDECAR__CONNECTED_PLATFORMS": '["telegram", "x\udcff"]',
           "AGENT_SIDECAR_PROFILES__B\udcff__MODEL": "echo"}
    lines = problems(tmp_path, '[[auth.tokens]]\ntoken_env = "T"\n', {**env, "T": "t\udcff"})
    assert sorted(names(lines)) == sorted([
        "auth.tokens[0].token_env", "sidecar.connected_platforms[1]", "profiles.b\udcff",
        "profiles.main.model_options.k\udcff", "profiles.main.model_options.s[0]",
        "profiles.main.system_prompt"]), lines
    assert all("UTF-8" in line for line in lines) and "t\udcff" not in "".join(lines)
    r = cli("config", "check", os.devnull, env={"AGENT_SIDECAR_PROFILES__MAIN__SYSTEM_PROMPT": "hi\udcff"})
    assert refused(r) == ['config error: profiles.main.system_prompt: must be valid UTF-8 (it has an '
                          'undecodable byte) (got "hi\\udcff") [from AGENT_SIDECAR_PROFILES__MAIN__SYSTEM_PROMPT]']


# -- the config file itself ------------------------------------------------------------------------

@pytest.mark.parametrize("content,what", [
    (b'[sidecar]\nlog_level = "\xff"\n', "codec can't decode byte 0xff"),
    (b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    (b"a = 1" + b"0" * 5000 + b"\n", "digits"),
])
def test_a_config_file_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, content, what):
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    r = cli("config", "check", str(path))
    lines = refused(r)
    assert len(lines) == 1 and lines[0].startswith(f"config error: cannot read config {path}: "), lines
    assert what in lines[0]


def test_a_config_file_that_is_a_device_is_refused_not_read_without_end(tmp_path):
    assert refused(check(tmp_path, None)) == \
        ["config error: cannot read config /dev/zero: /dev/zero is larger than 16 MiB"]


# -- workers -----------------------------------------------------------------------------------------

def test_workers_has_an_upper_bound_from_the_file_the_environment_and_the_flag(tmp_path):
    assert names(problems(tmp_path, "[sidecar]\nworkers = 9223372036854775807\n")) == ["sidecar.workers"]
    lines = problems(tmp_path, "", {"AGENT_SIDECAR_SIDECAR__WORKERS": "257"})
    assert lines == ["config error: sidecar.workers: must be at most 256 (got 257) "
                     "[from AGENT_SIDECAR_SIDECAR__WORKERS]"]
    assert load(tmp_path, "[sidecar]\nworkers = 256\n").workers == 256
    data = tmp_path / "d"
    r = cli("serve", "--data-dir", str(data), "--listen", f"unix:{tmp_path}/s.sock", "--workers", "10000")
    assert refused(r) == ["config error: sidecar.workers: must be at most 256 (got 10000) [from --workers]"]
    assert not data.exists()


# -- listen addresses --------------------------------------------------------------------------------

A_TOKEN = '[[auth.tokens]]\ntoken = "t"\n'


@pytest.mark.parametrize("address", [":::9464", "::1:50051", "[::1", "[::1]", "[::g]:1", "1.2.3.4.5:80", "256.1.1.1:80",
                                     "host name:80", " 127.0.0.1:80", "127.0.0.1:80 ", "h:99999", "h:-1",
                                     "h:\u0665", "-h:1", ":80"])
def test_a_listen_address_that_cannot_be_bound_is_refused_naming_the_key(tmp_path, address):
    lines = problems(tmp_path, A_TOKEN + f'[sidecar]\nlisten = ["{address}"]\n[[listen]]\naddress = "{address}"\n'
                               f'[metrics]\nlisten = "{address}"\n')
    assert names(lines) == ["sidecar.listen[0]", "listen[0].address", "metrics.listen"], lines


def test_a_unix_socket_path_longer_than_the_kernel_takes_is_refused_naming_the_key(tmp_path):
    """Such a path loaded, then the start failed in gRPC's words ("Failed to
    bind to address ...; set GRPC_VERBOSITY=debug ...")."""
    long = "unix:/tmp/" + "s" * 103  # 108 bytes of path: one past the 107 a sockaddr_un holds
    lines = problems(tmp_path, f'[sidecar]\nlisten = ["{long}"]\n[[listen]]\naddress = "{long}"\n')
    assert names(lines) == ["sidecar.listen[0]", "listen[0].address"], lines
    assert "at most 107 bytes; this one is 108" in lines[0], lines
    assert load(tmp_path, f'[sidecar]\nlisten = ["{long[:-1]}"]\n').listen == [long[:-1]]


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "0.0.0.0:0", "[::]:50051", "[::1]:1",
                                     "[fe80::1%eth0]:5", "localhost:65535", "db-1.example.com:5", "h_2.local.:7"])
def test_a_listen_address_of_every_form_loads(tmp_path, address):
    cfg = load(tmp_path, A_TOKEN + f'[sidecar]\nlisten = ["{address}"]\n[metrics]\nlisten = "{address}"\n')
    assert cfg.listen == [address] and cfg.metrics.listen == address


def test_an_advertised_address_is_host_and_a_port_others_can_reach(tmp_path):
    pg = '[store]\nbackend = "postgres"\ndsn = "postgresql://db/sidecar"\n'
    for address in ("10.0.0.5:0", "10.0.0.5", "::1:5"):
        lines = problems(tmp_path, pg + f'[cluster]\nadvertise = "{address}"\n')
        assert names(lines) == ["cluster.advertise"] and "needs" not in lines[0], lines
    node = pg + '[[auth.tokens]]\ntoken = "c"\nadmin = true\n[cluster]\ntoken = "c"\n'
    assert load(tmp_path, node + 'advertise = "[::1]:5"\n').cluster.advertise == "[::1]:5"


def test_a_lease_ttl_no_database_or_keeper_can_keep_is_refused(tmp_path):
    """A lease ends at the database's now() plus the TTL (1e300 s: 'timestamp
    out of range', every prompt INTERNAL) and is renewed every third of it
    (a few milliseconds: the keeper hammers the database, and HTTP/2 pings
    to a holder are floored at a second)."""
    pg = '[store]\nbackend = "postgres"\ndsn = "postgresql://db/sidecar"\n'
    for ttl in ("1e300", "1e7", "0.01", "0.5"):
        lines = problems(tmp_path, pg + f"[cluster]\nlease_ttl_s = {ttl}\n")
        assert names(lines) == ["cluster.lease_ttl_s"], lines
    for ttl in ("1", "10", "86400"):
        assert load(tmp_path, pg + f"[cluster]\nlease_ttl_s = {ttl}\n").cluster.lease_ttl_s == float(ttl)


# -- the environment overlay -------------------------------------------------------------------------

def test_an_environment_value_of_more_than_one_toml_value_is_refused(tmp_path):
    lines = problems(tmp_path, "", {"AGENT_SIDECAR_SIDECAR__WORKERS": "4\nx = 1",
                                    "AGENT_SIDECAR_SIDECAR__REDACT_PII": "true\n[t]\nv = 1"})
    assert names(lines) == ["sidecar.redact_pii", "sidecar.workers"], lines
    env = {"AGENT_SIDECAR_SIDECAR__WORKERS": "4\n", "AGENT_SIDECAR_SIDECAR__REDACT_PII": "true # on"}
    cfg = load(tmp_path, "", env)
    assert (cfg.workers, cfg.redact_pii) == (4, True)


@pytest.mark.parametrize("text, key", [
    ('[[auth.tokens]]\ntoken = "se\\ncret"\n', "auth.tokens[0].token"),
    ('[[auth.tokens]]\ntoken = "sécret"\n', "auth.tokens[0].token"),
    ('[cluster]\ntoken = "se\\tcret"\n', "cluster.token"),
])
def test_a_token_no_client_can_send_is_refused_without_showing_it(tmp_path, text, key):
    """gRPC metadata carries printable ASCII: before, such a token loaded and every call made
    with it failed on the client, INTERNAL 'Invalid metadata'."""
    lines = refused(check(tmp_path, text))
    assert any(line.startswith(f"config error: {key}: must be printable ASCII") for line in lines), lines
    assert "cret" not in "".join(lines)

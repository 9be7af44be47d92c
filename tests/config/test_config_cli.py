"""The configuration from the outside (issue 17 item 6): ``agent-sidecar
config check|show|reference``, ``--version``, ``serve`` refusing a bad
environment, a real sidecar running with settings and a token that came from
the environment and a token file, the process titles ``ps`` shows, and
docs/configuration.md holding every key the loader knows."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import grpc
import pytest
from helpers.cli import cli
from helpers.procs import children, cmdline, comm
from helpers.streams import assert_well_formed, prompt_req
from helpers.streams import run as run_prompt
from helpers.waiting import wait_until
from sidecar_proc import ROOT, TOKEN, Sidecar
from test_config import leaves

import agent_sidecar
from agent_sidecar.cli.config_cmd import BEGIN, END, reference
from agent_sidecar.config import Config, load_config
from agent_sidecar.config_schema import tree
from agent_sidecar.v1 import session_service_pb2 as spb

DOC = ROOT / "docs" / "configuration.md"


# -- the commands ----------------------------------------------------------------------------------

def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout == f"agent-sidecar {agent_sidecar.__version__}\n"
    assert agent_sidecar.__version__ == "0.1.0"


def test_config_check_accepts_a_good_file_in_one_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[sidecar]\nlisten = ["127.0.0.1:50051"]\n[[auth.tokens]]\ntoken_env = "T"\n'
                    '[profiles.gpt]\nmodel = "openai"\nmodel_options = { model = "gpt-4o-mini" }\n')
    r = cli("config", "check", str(path), env={"T": "x"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith(f"{path}: ok (2 profile(s): gpt, main; 1 token(s)")
    assert not (tmp_path / "data").exists()  # no sidecar, no store


def test_postgres_without_its_driver_is_a_config_error_not_a_traceback(tmp_path):
    """An install without the postgres extra: the sitecustomize hides psycopg
    as if it were not installed; check and serve say what to install."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['psycopg'] = None\n")
    path = tmp_path / "c.toml"
    path.write_text('[store]\nbackend = "postgres"\ndsn = "host=/nowhere"\n')
    for args in (("config", "check", str(path)), ("serve", "--config", str(path),
                                                   "--data-dir", str(tmp_path / "data"))):
        r = cli(*args, env={"PYTHONPATH": str(hide)})
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr.splitlines() == [f"agent-sidecar {args[0]}: config error: store.backend: \"postgres\" needs "
                                         "its driver, which is not installed: pip install 'agent-sidecar[postgres]' "
                                         "(got \"postgres\")"]


def test_config_check_reports_every_problem_and_exits_2(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[sidecar]\nlisten = [42]\n[profiles.main]\ntools = [1, 2]\nmax_iterations = -5\n'
                    'model = "ecoh"\n[agent.agent_cache]\nmax_size = -1\n')
    r = cli("config", "check", str(path), env={"AGENT_SIDECAR_SIDECAR__WORKERS": "-2"})
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert all(line.startswith("agent-sidecar config: config error: ") for line in lines), lines
    assert [line.split(": ")[2] for line in lines] == [
        "sidecar.listen[0]", "sidecar.workers", "profiles.main.tools[0]", "profiles.main.tools[1]",
        "profiles.main.max_iterations", "agent.agent_cache.max_size", "profiles.main.model"]
    assert lines[1].endswith("[from AGENT_SIDECAR_SIDECAR__WORKERS]")
    r = cli("config", "check", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "missing.toml" in r.stderr


def test_a_built_in_backends_bad_options_are_config_errors_not_failed_turns(tmp_path):
    """model_options a built-in backend refuses (openai without its model, an
    option it does not know, a value of the wrong kind, a key variable that is
    not set) stop `config check` and `serve` with exit 2, naming the profile,
    before anything starts: each used to load, and every turn of the profile
    then failed LLM_API_FAILURE."""
    path = tmp_path / "c.toml"
    path.write_text('[profiles.a]\nmodel = "openai"\n'
                    '[profiles.b]\nmodel = "openai"\nmodel_options = { model = "m", tempreature = 0.2 }\n'
                    '[profiles.c]\nmodel = "echo"\nmodel_options = { token_latency_ms = "slow" }\n'
                    '[profiles.d]\nmodel = "scripted"\nmodel_options = { steps = [{ txt = "hi" }] }\n'
                    '[profiles.e]\nmodel = "openai"\nmodel_options = { model = "m", api_key_env = "NO_SUCH_KEY" }\n'
                    '[profiles.f]\nmodel = "openai"\nmodel_options = { model = "m", temperature = "warm" }\n'
                    '[profiles.ok]\nmodel = "openai"\nmodel_options = { model = "m", api_key_env = "THE_KEY" }\n')
    data = tmp_path / "data"
    for args in (("config", "check", str(path)), ("serve", "--config", str(path), "--data-dir", str(data))):
        r = cli(*args, env={"THE_KEY": "sk-test"})
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        lines = r.stderr.splitlines()
        assert [line.split(": ")[2] for line in lines] == [
            f"profiles.{p}.model_options" for p in "abcdef"], lines
        assert "option 'model' is required" in lines[0] and "['tempreature']" in lines[1]
        assert "token_latency_ms must be a number" in lines[2] and "['txt']" in lines[3]
        assert "'NO_SUCH_KEY' (api_key_env) is not set" in lines[4]
        assert "temperature must be a number >= 0, got 'warm'" in lines[5]
    assert not data.exists()  # refused before the store was made


@pytest.mark.parametrize("model, options, error", [
    ("openai", '{ model = "m", api_key_env = 5 }', "openai backend: api_key_env must be the name of an environment"),
    ("scripted", "{ steps_file = 5 }", "scripted backend: steps_file must be a file name, got 5"),
    ("scripted", "{ steps = [{ sleep_ms = nan }] }", "step 0: sleep_ms must be a finite number >= 0"),
    ("echo", "{ token_latency_ms = inf }", "echo backend: token_latency_ms must be a finite number >= 0"),
])
def test_options_of_the_wrong_kind_are_one_config_error_never_a_traceback(tmp_path, model, options, error):
    """Options a backend's constructor met with a TypeError (a number where a
    name belongs) were a traceback of `config check`; an infinite latency
    passed, and every turn of the profile waited for its timeout."""
    path = tmp_path / "c.toml"
    path.write_text(f'[profiles.x]\nmodel = "{model}"\nmodel_options = {options}\n')
    r = cli("config", "check", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == ["agent-sidecar config: config error: profiles.x.model_options: "
                                     + r.stderr.split(": ", 3)[3].strip()]
    assert error in r.stderr, r.stderr


def test_config_show_prints_what_loads_back_with_secrets_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_KEY", "sk-test")  # the backend, built at load, reads it
    secret = tmp_path / "token"
    secret.write_text("hunter2\n")
    path = tmp_path / "c.toml"
    path.write_text(f'[[auth.tokens]]\ntoken_file = "{secret}"\nplatforms = ["Slack"]\n'
                    '[sidecar]\nhome_channels = { telegram = { chat_id = "-1", name = "Home" } }\n'
                    '[profiles.gpt]\nmodel = "openai"\nmodel_options = { model = "m", base_url = "http://h/v1",'
                    ' api_key_env = "OPENAI_KEY", extra_headers = { Authorization = "Bearer sk-live-1",'
                    ' X-Org = "org-2" } }\n')
    r = cli("config", "show", str(path), env={"AGENT_SIDECAR_SIDECAR__WORKERS": "3", "OPENAI_KEY": "sk-test"})
    assert r.returncode == 0, r.stderr
    assert "hunter2" not in r.stdout and 'token = "***"' in r.stdout
    # A model's options: headers masked (any may be a credential), where a key lives shown.
    assert "sk-live-1" not in r.stdout and "org-2" not in r.stdout and "OPENAI_KEY" in r.stdout
    shown = tmp_path / "shown.toml"
    shown.write_text(r.stdout)
    again = load_config(str(shown), environ={})
    original = load_config(str(path), environ={"AGENT_SIDECAR_SIDECAR__WORKERS": "3"})
    original.tokens[0].token = "***"
    original.profiles["gpt"].model_options["extra_headers"] = {"Authorization": "***", "X-Org": "***"}
    assert again == original and again.workers == 3


def test_serve_refuses_a_bad_environment_before_starting(tmp_path):
    r = cli("serve", "--data-dir", str(tmp_path / "d"), "--listen", f"unix:{tmp_path}/x.sock",
            env={"AGENT_SIDECAR_SIDECAR__DRAIN_TIMEOUT": "soon", "AGENT_SIDECAR_SIDECAR__DRAIN_TIMOUT": "5"})
    assert r.returncode == 2
    assert "config error: sidecar.drain_timeout: expected a number" in r.stderr
    assert "config error: AGENT_SIDECAR_SIDECAR__DRAIN_TIMOUT: names no config key" in r.stderr
    assert not (tmp_path / "x.sock").exists() and not (tmp_path / "d").exists()


# -- a real sidecar ----------------------------------------------------------------------------------

def test_a_sidecar_from_environment_and_token_file_titles_its_processes(tmp_path):
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    sc = Sidecar(tmp_path / "data", tcp=True, workers=2,
                 config=f'[[auth.tokens]]\ntoken_file = "{secret}"\nadmin = true\n',
                 env={"AGENT_SIDECAR_SIDECAR__LIMITS__MAX_TEXT_BYTES": "10"}).start()
    try:
        stub = sc.sessions(tcp=True)
        stub.ListSessions(spb.ListSessionsRequest(), timeout=10,
                          metadata=[("authorization", f"Bearer {TOKEN}")])
        out = run_prompt(sc.prompts(), prompt_req(text="x" * 11))
        assert (out.code, out.field) == (grpc.StatusCode.INVALID_ARGUMENT, "text")
        assert_well_formed(run_prompt(sc.prompts(), prompt_req(text="x" * 10)))

        pid = sc.proc.pid
        assert cmdline(pid) == f"agent-sidecar: main (data {sc.data_dir})"
        assert not comm(pid).startswith("agent-sidecar:")  # comm stays the program's name

        def titled() -> dict[str, str] | None:  # the writer and both workers, once all are up
            t = {cmdline(c): comm(c) for c in children(sc).values() if cmdline(c).startswith("agent-sidecar: ")}
            return t if len(t) >= 3 else None
        kids = wait_until(titled)
        assert kids == {"agent-sidecar: store writer": "sidecar-writer",
                        "agent-sidecar: worker 0": "sidecar-work-0",
                        "agent-sidecar: worker 1": "sidecar-work-1"}
    finally:
        sc.stop()


# -- the reference ---------------------------------------------------------------------------------

def test_the_key_reference_in_the_docs_is_up_to_date():
    doc = DOC.read_text()
    assert doc.split(BEGIN, 1)[1].split(END, 1)[0] == "\n" + reference(), \
        "docs/configuration.md is stale: run `make docs` and commit"


def test_the_docs_name_every_key_the_loader_knows():
    doc = DOC.read_text()
    tables = doc.split(BEGIN, 1)[1]
    for path, _ in leaves():
        table = ".".join("NAME" if p == "x" else str(p) for p in path[:-1] if p != 0)
        heading = f"`[[{table}]]`" if 0 in path else f"`[{table}]`" if table else "Top level"
        section = tables.split(f"#### {heading}\n", 1)[1].split("\n#### ", 1)[0]
        assert f"| `{path[-1]}` |" in section, (path, heading)


def _example() -> str:
    doc = DOC.read_text()
    return re.search(r"## A complete file\n.*?```toml\n(.*?)```", doc, re.S).group(1)


def test_the_complete_example_loads_and_sets_every_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # its gpt profile's api_key_env
    from helpers.certs import available, make_certs
    if not available():
        pytest.skip("the openssl command is not installed (the example's [[listen]] files)")
    tls = make_certs(tmp_path / "tls").dir  # the files the example's [[listen]] names
    path = tmp_path / "example.toml"
    path.write_text(_example().replace("/etc/agent-sidecar/tls/", f"{tls}/"))
    cfg = load_config(str(path), environ={"SIDECAR_TOKEN": "t", "SIDECAR_CLUSTER_TOKEN": "c"})
    assert cfg.tokens[0].token == "t" and set(cfg.profiles) == {"main", "gpt"}
    assert cfg.cluster.token == cfg.tokens[1].token == "c" and cfg.tokens[1].admin
    raw = tomllib.loads(_example())
    for path_, slot in leaves():
        if slot.form:
            continue
        node = raw
        for p in path_[:-1]:
            node = node[0] if p == 0 else next(iter(node.values())) if p == "x" else node[p]
        secret = slot.md.get("secret")
        assert any(path_[-1] + f in node for f in ("", "_env", "_file")) if secret \
            else path_[-1] in node, path_
    assert tree(Config)  # the schema is what the loader walks


def test_the_readme_example_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # its gpt profile's api_key_env
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    path = tmp_path / "readme.toml"
    path.write_text(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    cfg = load_config(str(path), environ={"SIDECAR_TOKEN": "t"})
    assert cfg.tokens[0].token == "t" and cfg.limits.max_prompts_in_flight == 1000


def test_without_setproctitle_the_title_is_left_alone():
    code = ("import sys; sys.modules['setproctitle'] = None\n"
            "from agent_sidecar.children import set_title\n"
            "set_title('main (data x)')\n"
            "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == sys.executable, r.stderr


@pytest.mark.parametrize("what", ["missing dir", "a directory", "not utf-8", "no markers"])
def test_reference_write_to_what_it_cannot_rewrite_is_one_line_and_exit_2(tmp_path, what):
    """Before, the first three were tracebacks (FileNotFoundError, IsADirectoryError,
    UnicodeDecodeError)."""
    path = {"missing dir": tmp_path / "nope" / "x.md", "a directory": tmp_path,
            "not utf-8": tmp_path / "ff.md", "no markers": tmp_path / "plain.md"}[what]
    if what == "not utf-8":
        path.write_bytes(b"\xff\xfe")
    elif what == "no markers":
        path.write_text("# nothing to replace\n")
    r = cli("config", "reference", "--write", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and str(path) in r.stderr, r.stderr


def _doc_examples() -> list[tuple[str, int, str]]:
    """Every ```toml block of README.md and docs/*.md: (file, line, text)."""
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S):
            out.append((doc.name, text.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


def test_every_toml_example_of_the_docs_loads(tmp_path, monkeypatch):
    """A reader copies a block of the docs, sets the variables and files it
    names, and `config check` takes it: the README's cluster block lacked the
    [[auth.tokens]] entry its cluster token must be, its TLS block the token
    every TCP listener needs, and each was refused."""
    from helpers.certs import available, make_certs
    if not available():
        pytest.skip("the openssl command is not installed (the examples' [[listen]] files)")
    certs = make_certs(tmp_path / "tls")
    secret = tmp_path / "sidecar-token"
    secret.write_text("s3cret\n")
    files = {"/etc/agent-sidecar/tls/server.pem": certs.server_cert,
             "/etc/agent-sidecar/tls/server.key": certs.server_key,
             "/etc/agent-sidecar/tls/clients-ca.pem": certs.ca, "/etc/agent-sidecar/tls/ca.pem": certs.ca,
             "/etc/agent-sidecar/tls/client.pem": certs.client_cert,
             "/etc/agent-sidecar/tls/client.key": certs.client_key, "/run/secrets/sidecar-token": secret}
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # what the examples' gpt profiles name
    env = {"SIDECAR_TOKEN": "t", "SIDECAR_CLUSTER_TOKEN": "c", "SIDECAR_PG_DSN": "host=/nowhere"}
    examples = _doc_examples()
    assert len(examples) >= 9
    for name, line, text in examples:
        for path, real in files.items():
            text = text.replace(path, str(real))
        path = tmp_path / "example.toml"
        path.write_text(text)
        try:
            load_config(str(path), environ=env)
        except Exception as exc:
            pytest.fail(f"{name}:{line}: {exc}")

"""Deployment files (deploy/) and systemd readiness.

No container registry is reachable here, so the image cannot be built; instead
the Dockerfile is read and checked against the repository: what it copies
exists (and is not excluded by .dockerignore), the commands it runs are the
console script's and parse with its own argument parser, it runs as a non-root
uid with the data dir as a volume, and its health check asks the socket in that
volume. The systemd unit and the Kubernetes example are checked the same way
(and with `systemd-analyze verify` where it exists). The sd_notify path runs
for real: a sidecar started with NOTIFY_SOCKET pointing at a datagram socket
this test listens on, after a crash, so its startup restore has work to do.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import tomllib
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.config import echo
from helpers.ids import source
from helpers.streams import PromptRun, watch
from sidecar_proc import Sidecar

from agent_sidecar.cli.main import build_parser
from agent_sidecar.config import Config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DRAIN_DEFAULT = Config().drain_timeout


# -- Dockerfile ------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            op, _, rest = current.strip().partition(" ")
            lines.append((op.upper(), rest.strip()))
        current = ""
    return lines


def exec_form(args: str) -> list[str]:
    assert args.startswith("["), f"use the exec form (JSON array): {args}"
    return json.loads(args)


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins)."""
    ignored = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern.rstrip("/") + "/"):
            ignored = not negate
    return ignored


def test_the_dockerfile_copies_what_the_repo_has_and_runs_its_own_commands():
    steps = dockerfile()
    copied = []
    for op, args in steps:
        if op in ("COPY", "ADD") and "--from=" not in args:
            *sources, _dest = shlex.split(args)
            copied += [s for s in sources if not s.startswith("--")]
    assert copied, "the Dockerfile copies nothing"
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert not dockerignored(src), f"COPY {src}: excluded by .dockerignore"
    # what `pip wheel .` builds from needs the package sources
    assert {"pyproject.toml", "server"} <= {s.rstrip("/").removeprefix("./") for s in copied}
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme in copied and "LICENSE" in copied

    last = {op: args for op, args in steps}
    entry, cmd = exec_form(last["ENTRYPOINT"]), exec_form(last["CMD"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["agent-sidecar"] and "agent-sidecar" in scripts
    serve = build_parser().parse_args(cmd)
    assert serve.command == "serve"

    user = last["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"USER {last['USER']}: run as a non-root uid"
    volumes = exec_form(last["VOLUME"])
    assert serve.data_dir in volumes, (serve.data_dir, volumes)
    # `docker exec … agent-sidecar status|doctor|backup` with no options: their defaults
    # (./data, unix:./data/sidecar.sock) are this sidecar's from the working directory.
    status, doctor = build_parser().parse_args(["status"]), build_parser().parse_args(["doctor"])
    workdir = last["WORKDIR"]
    assert os.path.normpath(os.path.join(workdir, "data")) == serve.data_dir, workdir
    assert status.target == "unix:./data/sidecar.sock" and doctor.data_dir is None  # config's, else ./data

    health = last["HEALTHCHECK"]
    assert "CMD" in health
    probe = exec_form(health.split("CMD", 1)[1].strip())
    assert probe[0] == "agent-sidecar"
    args = build_parser().parse_args(probe[1:])
    assert args.command == "health"
    assert args.target == f"unix:{serve.data_dir}/sidecar.sock", "the health check asks the served socket"
    # Named, not the default: TCP listeners added to the command or the config keep it.
    assert args.target in serve.listen, (args.target, serve.listen)


# -- systemd ---------------------------------------------------------------------------


def unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str
    cp.read(DEPLOY / "agent-sidecar.service")
    return cp


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", value.strip())
    assert m, value
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_the_systemd_unit_waits_for_readiness_restarts_on_failure_and_outlasts_the_drain():
    service = unit()["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    # A config error (exit 2, tests/config) fails the unit at once: a restart would repeat it.
    assert service["RestartPreventExitStatus"].split() == ["2"]
    assert seconds(service["TimeoutStopSec"]) > DRAIN_DEFAULT
    assert service["KillSignal"] == "SIGTERM"
    exe, *argv = shlex.split(service["ExecStart"])
    assert exe.endswith("/agent-sidecar")
    args = build_parser().parse_args(argv)
    assert args.command == "serve" and args.data_dir.endswith(service["StateDirectory"])


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze here")
def test_systemd_analyze_finds_nothing_to_say_about_the_unit(tmp_path):
    venv_exe = str(Path(sys.executable).parent / "agent-sidecar")  # ExecStart must name an executable
    text = (DEPLOY / "agent-sidecar.service").read_text()
    text = re.sub(r"ExecStart=\S+", f"ExecStart={venv_exe}", text)
    path = tmp_path / "agent-sidecar.service"
    path.write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr


# -- Kubernetes ------------------------------------------------------------------------


def test_the_kubernetes_example_shares_the_socket_as_one_uid_and_waits_out_the_drain():
    text = (DEPLOY / "kubernetes" / "sidecar.yaml").read_text()
    drain = float(re.search(r"drain_timeout\s*=\s*(\d+)", text).group(1))
    grace = float(re.search(r"terminationGracePeriodSeconds:\s*(\d+)", text).group(1))
    assert grace >= drain, (grace, drain)
    uids = set(re.findall(r"runAs(?:User|Group):\s*(\d+)", text))
    image_uid = next(a for op, a in dockerfile() if op == "USER").split(":")[0]
    assert uids == {image_uid}, (uids, image_uid)
    # the sidecar's args parse, and the socket it listens on is on a volume both containers mount
    block = re.search(r"args:\n((?:\s+- .+\n)+)", text).group(1)
    args = build_parser().parse_args([a.strip()[2:] for a in block.splitlines()])
    assert args.command == "serve" and len(args.listen) == 1
    sock_dir = os.path.dirname(args.listen[0].removeprefix("unix:"))
    mounts = re.findall(r"- name: (\S+)\n\s+mountPath: (\S+)", text)
    sharing = [name for name, path in mounts if path == sock_dir]
    assert len(sharing) == 2 and len(set(sharing)) == 1, mounts
    probes = re.findall(r"(\w+Probe):\n\s+exec:\n\s+command: (\[[^]]+\])\n((?:\s+\w+: \d+\n)+)", text)
    assert {kind for kind, _, _ in probes} == {"startupProbe", "readinessProbe", "livenessProbe"}, probes
    for kind, command, settings in probes:
        cmd = json.loads(command)
        health = build_parser().parse_args(cmd[1:])
        assert cmd[0] == "agent-sidecar" and health.target == args.listen[0]
        # Kubernetes' own timeout (1 s unless set) must outlast the command's.
        timeout = re.search(r"timeoutSeconds: (\d+)", settings)
        assert timeout and float(timeout.group(1)) > health.timeout, (kind, settings)
        # Alive is any answer: a NOT_SERVING sidecar (full disk, drain) is not restarted.
        assert health.live == (kind == "livenessProbe"), kind


# -- sd_notify -------------------------------------------------------------------------


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def _start_in_background(sc: Sidecar) -> threading.Thread:
    t = threading.Thread(target=sc.start, daemon=True)
    t.start()
    return t


def test_ready_comes_after_the_restore_and_stopping_on_sigterm(tmp_path):
    slow = echo("main", 100)
    sc = Sidecar(tmp_path / "data", config=slow + "\n[sidecar]\ndrain_timeout = 1.0\n").start()
    interrupted = PromptRun(sc.prompts(), text=" ".join(["word"] * 100), src=source())
    interrupted.wait_for("text_delta")
    sc.kill9()  # the restart has a turn to close and a lane to resume

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(30)
    sc.env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    try:
        starter = _start_in_background(sc)
        ready = notify.recv(4096).decode().split("\n")
        assert "READY=1" in ready, ready
        # At READY the restore is done: health says SERVING, and the turn that the
        # crash interrupted is already closed in the store.
        assert _health(sc.target) == health_pb2.HealthCheckResponse.SERVING
        out = watch(sc.prompts(), request_id=interrupted.request_id, timeout=10)
        assert out.kinds()[-1] == "failed" and out.last.failed.reason == "restart_interrupted", out.kinds()
        starter.join(30)
        sc.proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in notify.recv(4096).decode().split("\n")
        assert sc.proc.wait(60) == 0
    finally:
        notify.close()
        sc.stop()


def test_ready_reaches_an_abstract_namespace_notify_socket(tmp_path):
    name = f"agent-sidecar-test-{uuid.uuid4().hex}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind("\0" + name)
    notify.settimeout(30)
    sc = Sidecar(tmp_path / "data", env={"NOTIFY_SOCKET": "@" + name})
    try:
        starter = _start_in_background(sc)
        assert "READY=1" in notify.recv(4096).decode().split("\n")
        starter.join(30)
        assert _health(sc.target) == health_pb2.HealthCheckResponse.SERVING
    finally:
        notify.close()
        sc.stop()


def test_the_health_command_exits_0_only_when_serving(tmp_path):
    exe = [sys.executable, "-m", "agent_sidecar", "health"]
    absent = subprocess.run(exe + ["--target", f"unix:{tmp_path}/none.sock", "--timeout", "1"],
                            capture_output=True, text=True, timeout=30)
    assert absent.returncode == 1, absent.stdout + absent.stderr
    with Sidecar(tmp_path / "data") as sc:
        up = subprocess.run(exe + ["--target", sc.target], capture_output=True, text=True, timeout=30)
    assert up.returncode == 0 and "SERVING" in up.stdout, up.stdout + up.stderr


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs to pin the sidecar to one")
def test_the_default_worker_count_is_the_cpus_the_sidecar_may_use(tmp_path):
    """`workers = 0` is one worker per CPU the sidecar may run on, not the host's
    count: pinned to one CPU (taskset; a container's CPU limit or systemd's
    CPUAffinity= alike) it starts one worker, where it used to start one per
    host core to share that CPU (64 in a 2-CPU pod on a 64-core node)."""
    with Sidecar(tmp_path / "data", config=echo("main"), workers=0,
                 wrapper=["taskset", "-c", str(min(os.sched_getaffinity(0)))]) as sc:
        assert len(sc.status().workers) == 1, sc.status().workers
        p = PromptRun(sc.prompts(), text="one worker is enough", src=source())
        p.done.wait(15)
        assert p.kinds()[-1] == "completed", p.kinds()


def _v1_hierarchy(controller: str, limit_file: str) -> str | None:
    """A cgroup v1 hierarchy of ``controller`` this test may make a child cgroup in (as root)."""
    for base in (f"/sys/fs/cgroup/{controller}", "/sys/fs/cgroup/cpu,cpuacct"):
        if os.path.isfile(os.path.join(base, limit_file)) and os.access(base, os.W_OK):
            return base
    return None


def _in_child_cgroup(base: str, limits: dict[str, str]):
    """A new child cgroup of ``base`` with ``limits`` written, and the wrapper
    that moves a command into it before it execs (the same pid)."""
    group = os.path.join(base, f"sidecar-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    for name, value in limits.items():
        Path(group, name).write_text(value)
    return group, ["sh", "-c", f'echo $$ > {shlex.quote(group)}/cgroup.procs && exec "$@"', "sh"]


@pytest.mark.skipif(_v1_hierarchy("cpu", "cpu.cfs_quota_us") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a writable cgroup v1 cpu hierarchy and two CPUs")
def test_the_default_worker_count_follows_the_quota_of_the_sidecars_own_cgroup(tmp_path):
    """On a cgroup v1 host a service's CPU quota is set on its own cgroup
    (systemd's CPUQuota= on system.slice/NAME.service), below the hierarchy's
    root: the sidecar in a child cgroup limited to half a CPU starts one
    worker, where it read only the root's (unlimited) quota and started one
    per CPU of its affinity."""
    base = _v1_hierarchy("cpu", "cpu.cfs_quota_us")
    assert base is not None
    group, join = _in_child_cgroup(base, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"})
    try:
        with Sidecar(tmp_path / "data", config=echo("main"), workers=0, wrapper=join) as sc:
            assert len(sc.status().workers) == 1, sc.status().workers
    finally:
        os.rmdir(group)


@pytest.mark.skipif(_v1_hierarchy("memory", "memory.limit_in_bytes") is None,
                    reason="needs a writable cgroup v1 memory hierarchy")
def test_memory_high_auto_reads_the_limit_of_the_sidecars_own_cgroup():
    """``memory_high_mb = "auto"`` on a cgroup v1 host, the limit set on the
    sidecar's own cgroup (systemd's MemoryLimit= on its service): it read
    only the hierarchy root's limit (none) and budgeted the host's RAM."""
    base = _v1_hierarchy("memory", "memory.limit_in_bytes")
    assert base is not None
    group, join = _in_child_cgroup(base, {"memory.limit_in_bytes": str(256 << 20)})
    try:
        code = "from agent_sidecar.turns.memory import detect_limit_bytes; print(detect_limit_bytes())"
        out = subprocess.run(join + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and int(out.stdout) == 256 << 20, out.stdout + out.stderr
    finally:
        os.rmdir(group)

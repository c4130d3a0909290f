"""A real, private Ray head on 127.0.0.1 for the tests and the latency bench, and a TCP relay to
the head that can be cut (FlakyLink).

Loaded as a pytest plugin (`pytest_plugins = ["tests.ray_head"]` in tests/conftest.py). The head
runs as a child in its own process group with every port chosen free and its own temp dir, so it
collides with nothing else on the machine, and it is ended through that group: `ray stop` would
end every Ray process on the machine.
"""

from __future__ import annotations

import fcntl
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from access.head_access import HeadAccessError, wait_for_dashboard

# A cold head takes about 8 s on a 2-core machine; leave room for a loaded CI.
HEAD_START_TIMEOUT_S = 90.0
# The head can take over 10 s to exit after SIGTERM.
HEAD_STOP_GRACE_S = 30.0
WORKER_PORTS = 16
HEAD_ENV = {
    # Ray maps --node-ip-address=127.0.0.1 to the machine's own address unless multi-node mode is
    # off; off, every Ray process binds and talks on loopback only (a joining node: tests/ray_loopback.py).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # No token authentication, whatever token file Ray finds (a test that wants it says so).
    "RAY_AUTH_MODE": "disabled",
    # Idle CPU (about 3.2 -> 1.9 CPU s a minute per head): the tests read no Ray metrics, no event loop stats,
    # no node CPU/memory reports and exercise no Ray OOM killing.
    "RAY_event_stats": "0",  # per-handler timing for debug_state.txt and metrics
    "RAY_enable_metrics_collection": "0",  # core workers', raylet's and GCS's Prometheus metrics
    "REPORTER_UPDATE_INTERVAL_MS": "3600000",  # the agent's psutil scan of the node for the dashboard's UI
    "METRICS_RECORD_INTERVAL_S": "3600",  # the dashboard's psutil scan of itself and its module processes
    "RAY_memory_monitor_refresh_ms": "0",  # the raylet's OOM-killing memory monitor
}


@dataclass(frozen=True)
class RayHead:
    """A running head: its process (leader of its own group), dashboard URL and temp dir."""

    process: subprocess.Popen[bytes] | _Adopted
    dashboard_url: str
    temp_dir: Path
    gcs_address: str = ""
    """host:port a second node joins with `ray start --address`."""
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (held open together while picked)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


NODE_PORT_SPAN = 10000
PORT_COUNTER = Path(tempfile.gettempdir()) / "verl-gke-ray-ports.next"
"""The next port node_ports hands out, machine-wide (read and written under PORT_LOCK)."""


def node_ports(count: int) -> list[int]:
    """`count` loopback ports for a Ray node, from the NODE_PORT_SPAN ports below the kernel's ephemeral range,
    handed out in turn machine-wide: a node binds its worker ports only when a worker starts, long after they
    were picked, and a port from free_ports (the ephemeral range) may by then be an outgoing connection's or
    another node's. Call under ports_held()."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = low - NODE_PORT_SPAN
    try:
        port = int(PORT_COUNTER.read_text())
    except (OSError, ValueError):
        port = first
    ports: list[int] = []
    for _ in range(NODE_PORT_SPAN):
        port = first + (port - first) % NODE_PORT_SPAN
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
                ports.append(port)
            except OSError:
                pass  # in use, or a socket of it in TIME_WAIT
        port += 1
        if len(ports) == count:
            PORT_COUNTER.write_text(str(port))
            return ports
    raise RuntimeError(f"fewer than {count} free loopback ports in {first}..{low - 1}")


PORT_LOCK = Path(tempfile.gettempdir()) / "verl-gke-ray-ports.lock"
"""Held from picking a node's ports until it listens on them: a process starting another node at the
same time (a second pytest worker) could otherwise pick a port just closed and not yet taken."""


@contextmanager
def ports_held(timeout_s: float = 2 * HEAD_START_TIMEOUT_S) -> Iterator[None]:
    """One node start at a time on the machine, each bounded by HEAD_START_TIMEOUT_S."""
    with _held(PORT_LOCK, timeout_s, "another Ray node start"):
        yield


@contextmanager
def _held(path: Path, timeout_s: float, holder: str) -> Iterator[None]:
    """An exclusive flock on `path`, waited for at most `timeout_s`."""
    with open(path, "a") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{holder} held {path} for over {timeout_s:g} s") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ray_start_command(temp_dir: Path, ray: Path | None = None) -> tuple[list[str], str]:
    """The `ray start --head --block` command line with every port free, and its dashboard URL;
    `ray` is the ray executable (default: this Python's). The GCS port is `--port`."""
    names = [
        "port", "dashboard-port", "ray-client-server-port", "node-manager-port",
        "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "runtime-env-agent-port", "metrics-export-port",
    ]
    ports = node_ports(len(names) + WORKER_PORTS)
    named = dict(zip(names, ports))
    worker_ports = ",".join(str(p) for p in ports[len(names):])
    command = [
        str(ray or Path(sys.executable).with_name("ray")), "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
        "--num-cpus=1", "--disable-usage-stats", f"--temp-dir={temp_dir}",
        # No autoscaler monitor (nothing autoscales; `ray status` is not used), and no log monitor on the
        # head: only the job drivers' own output is read, from their job logs; a worker's prints reach its
        # driver through its node's log monitor (start_node keeps it: the fabric ranks run on those nodes).
        "--no-monitor", "--include-log-monitor=false",
        f"--worker-port-list={worker_ports}",
        *(f"--{name}={port}" for name, port in named.items()),
    ]
    return command, f"http://127.0.0.1:{named['dashboard-port']}"


MULTI_NODE_ENV = {
    **HEAD_ENV,
    # The GCS checks each node every period and marks it DEAD after this many failures in a row
    # (Ray's ray_config_def.h; defaults 3000 ms x 5). A killed node refuses at once, so it is DEAD
    # after about 5 s instead of 15; a slow but live one still has 5 x 10 s to answer.
    "RAY_health_check_period_ms": "1000",
}
"""For a head that other nodes join, and for those nodes: every node names and binds 127.0.0.1."""
REPO = Path(__file__).resolve().parent.parent


def start_head(ray: Path | None = None, env: dict[str, str] | None = None) -> RayHead:
    """Starts a head (of the given ray executable) in its own process group and returns once its
    dashboard answers."""
    try:
        return _start_head(ray, env)
    except HeadStartError as error:
        # A loaded 2-core CI machine now and then starts a head that never serves its dashboard;
        # the product is not under test here, so one more head on fresh ports.
        print(f"ray_head: {error}; starting another head", file=sys.stderr)
        return _start_head(ray, env)


def _start_head(ray: Path | None, env: dict[str, str] | None) -> RayHead:
    # Short path: Ray puts unix sockets under the temp dir, and their paths are limited to ~107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    with ports_held():
        command, url = ray_start_command(temp_dir, ray)
        return _launch(command, url, temp_dir, env or HEAD_ENV)


def restart_head(head: RayHead) -> RayHead:
    """A KubeRay head pod restart without GCS fault tolerance: the head is killed and a new one
    starts on the same ports, knowing no jobs and no nodes."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    command = [f"--temp-dir={temp_dir}" if arg.startswith("--temp-dir=") else arg for arg in head.command]
    with ports_held():  # from the stop on: no node start of another worker may pick the ports it frees
        stop_head(head, grace_s=0.0)
        return _launch(command, head.dashboard_url, temp_dir, dict(head.env))


def _launch(command: list[str], url: str, temp_dir: Path, env: dict[str, str]) -> RayHead:
    log = open(temp_dir / "ray-start.log", "wb")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, **env},
    )
    log.close()
    gcs_port = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--port="))
    head = RayHead(process=process, dashboard_url=url, temp_dir=temp_dir, gcs_address=f"127.0.0.1:{gcs_port}",
                   command=tuple(command), env=tuple(env.items()))
    try:
        _wait_answering(url, env.get("RAY_AUTH_TOKEN"))
        check_loopback_only(process.pid)
    except HeadAccessError as error:
        logs = _log_tails(temp_dir)  # stop_head removes them
        stop_head(head)
        raise HeadStartError(f"{error}\n{logs}") from None
    except BaseException:
        stop_head(head)
        raise
    return head


def _wait_answering(url: str, token: str | None) -> None:
    """Until the dashboard answers; a head with token authentication is asked with its token."""
    if token is None:
        wait_for_dashboard(url, HEAD_START_TIMEOUT_S)
        return
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while True:
        request = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise HeadAccessError(f"Ray dashboard at {url} did not answer within {HEAD_START_TIMEOUT_S:g} s")
        time.sleep(0.5)


class HeadStartError(HeadAccessError):
    """A head whose dashboard never answered, with the end of its logs."""


def _log_tails(temp_dir: Path, lines: int = 15) -> str:
    paths = [temp_dir / "ray-start.log", *sorted((temp_dir / "session_latest" / "logs").glob("dashboard*.log")),
             temp_dir / "session_latest" / "logs" / "gcs_server.err"]
    tails = []
    for path in paths:
        if path.is_file():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(tails) or "(no logs)"


def start_node(head: RayHead, *, cpus: int = 2, gpus: int = 0, resources: str = "") -> subprocess.Popen[bytes]:
    """A second Ray node joined to `head` with `ray start --address`, in its own process group.
    `gpus` are logical GPU resources: Ray schedules by them, no device is needed. Returns once
    the head lists the node as ALIVE; end it with `stop_node` (a stand-in for a lost GPU node)."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port"]
    with ports_held():
        ports = node_ports(len(names) + WORKER_PORTS)
        command = [
            sys.executable, "-m", "tests.ray_loopback", "start", f"--address={head.gcs_address}", "--block",
            "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--disable-usage-stats",
            f"--worker-port-list={','.join(str(p) for p in ports[len(names):])}",
            *(f"--{name}={port}" for name, port in zip(names, ports)),
            *([f"--resources={resources}"] if resources else []),
        ]
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        while not (before := _alive_nodes(head.dashboard_url)):  # the head lists itself first
            if time.monotonic() > deadline:
                raise RuntimeError(f"the head at {head.dashboard_url} lists no nodes")
            time.sleep(0.3)
        log = open(head.temp_dir / f"ray-node-{ports[0]}.log", "wb")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, **MULTI_NODE_ENV}, cwd=REPO)
        log.close()
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        while (_alive_nodes(head.dashboard_url) or 0) <= before:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_node(process)
                raise RuntimeError(f"second Ray node did not join {head.gcs_address}; see {log.name}")
            time.sleep(0.3)
    try:
        check_loopback_only(process.pid)
    except AssertionError:
        stop_node(process)
        raise
    return process


NODE_DEATH_TIMEOUT_S = 60.0
"""The head marks a killed node DEAD after its health checks fail (about 5 s with MULTI_NODE_ENV)."""


def stop_node(process: subprocess.Popen[bytes], head: RayHead | None = None) -> None:
    """Kills a node's whole session at once, as a preempted VM disappears; with `head`, returns
    only once the head no longer counts the node ALIVE."""
    before = _alive_nodes(head.dashboard_url) if head else None
    outside = listening_outside_loopback(process.pid)  # what it opened since it started, too
    for pid in [process.pid, *_session_members(process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    deadline = time.monotonic() + NODE_DEATH_TIMEOUT_S
    while head and before and (_alive_nodes(head.dashboard_url) or before) >= before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the head still counts a killed node ALIVE after {NODE_DEATH_TIMEOUT_S:g} s")
        time.sleep(0.5)
    check_loopback_only(outside=outside)


def _alive_nodes(dashboard_url: str) -> int | None:
    """ALIVE nodes the head lists; None while its state API does not answer yet."""
    from ray.util.state import list_nodes

    try:
        return sum(1 for n in list_nodes(address=dashboard_url, timeout=10) if n.state == "ALIVE")
    except Exception:  # noqa: BLE001 a head still starting answers nothing useful yet
        return None


def stop_head(head: RayHead, grace_s: float = HEAD_STOP_GRACE_S) -> None:
    """Ends the head through its process group: SIGTERM, then SIGKILL for whatever is left of its
    session after the grace period (Ray workers take process groups of their own)."""
    leader = head.process.pid
    outside = listening_outside_loopback(leader)  # what it opened since it started, too
    _signal_group(leader, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        head.process.poll()  # reap the leader so it does not count as alive
        if not _session_members(leader):
            break
        time.sleep(0.2)
    else:
        _signal_group(leader, signal.SIGKILL)
        for pid in _session_members(leader):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    head.process.wait()
    shutil.rmtree(head.temp_dir, ignore_errors=True)
    check_loopback_only(outside=outside)


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _session_members(session: int) -> list[int]:
    """Live (not zombie) processes of a session, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name may hold spaces and parentheses: fields start after the last ')'.
            state, _ppid, _pgrp, sid = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, IndexError, ValueError):
            continue
        if int(sid) == session and state != "Z":
            members.append(int(stat.parent.name))
    return members


_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def listening_outside_loopback(*sessions: int) -> list[str]:
    """Listening TCP/UDP sockets of the processes of these sessions (a head's or a node's, started in
    sessions of their own) on anything but the loopback interface, as `name (pid N) on ip:port`."""
    import psutil

    found = []
    for pid in sorted({p for session in sessions for p in [session, *_session_members(session)]}):
        try:
            process = psutil.Process(pid)
            name, sockets = process.name(), process.net_connections(kind="inet")
        except psutil.Error:
            continue  # ended meanwhile
        for sock in sockets:
            if sock.status not in (psutil.CONN_LISTEN, psutil.CONN_NONE) or not sock.laddr:
                continue
            address = ipaddress.ip_address(sock.laddr.ip)
            address = getattr(address, "ipv4_mapped", None) or address
            if not any(address in net for net in _LOOPBACK):
                found.append(f"{name} (pid {pid}) on {sock.laddr.ip}:{sock.laddr.port}")
    return found


def check_loopback_only(*sessions: int, outside: list[str] | None = None) -> None:
    """Fails the test that started a Ray process which listens outside the loopback interface."""
    if outside := (listening_outside_loopback(*sessions) if outside is None else outside):
        raise AssertionError("test Ray processes must listen on 127.0.0.1 only: " + "; ".join(outside))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: starts or uses a real local Ray head")


_CLUSTER: dict[str, RayHead] = {}
"""The head the modules that use ray_cluster one after another share (tests/conftest.py groups them)."""
_NEXT: list[pytest.Item | None] = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _NEXT[0] = nextitem  # for ray_cluster's teardown, which runs within this hook


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayHead]:
    """A head (0 GPUs) that nodes join and leave with `start_node`; each test stops the nodes it started,
    and waits for the head to count them dead, so the next test counts only its own. Modules that use it
    one after another (one pytest-xdist group) share one head, each through a JobView of its own (its jobs
    alone are listed, as on a head of the module's own); it stops after the last of them."""
    if "head" not in _CLUSTER:
        _CLUSTER["head"] = start_head(env=MULTI_NODE_ENV)
    head = _CLUSTER["head"]
    view = JobView(head.dashboard_url)
    try:
        yield replace(head, dashboard_url=view.url)
    finally:
        view.close()
        if _NEXT[0] is None or "ray_cluster" not in getattr(_NEXT[0], "fixturenames", ()):
            # Its state is thrown away: no need to let it shut down cleanly.
            stop_head(_CLUSTER.pop("head"), grace_s=5.0)


SHARED_HEAD = "ray-head.json"
"""In the run's folder: the one head every pytest worker's `ray_head` uses (its URL, pid and temp dir)."""


def _run_folder(config: pytest.Config) -> Path:
    """The temp folder of the whole run: under pytest-xdist the controller's, which holds each worker's."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(scope="session")
def ray_head(request: pytest.FixtureRequest) -> Iterator[str]:
    """The dashboard URL of a real Ray head on 127.0.0.1 as this pytest worker sees it (a JobView): one head
    for the whole run, started by the first worker that needs it and stopped once, by the run's controller
    (pytest_sessionfinish below), or by its watchdog should the controller die first."""
    view = JobView(shared_head(_run_folder(request.config), under_xdist=hasattr(request.config, "workerinput")))
    try:
        yield view.url
    finally:
        view.close()


def shared_head(folder: Path, under_xdist: bool) -> str:
    """The run's head's dashboard URL: started here unless another worker did (they wait for it)."""
    record = folder / SHARED_HEAD
    with _held(folder / "ray-head.lock", 3 * HEAD_START_TIMEOUT_S, "another pytest worker starting the Ray head"):
        if record.is_file():
            return str(json.loads(record.read_text())["dashboard_url"])
        # A home of the run's own, not the starting worker's (removed when that worker exits).
        home = folder / "ray-head-home"
        workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") if under_xdist else "1"
        head = start_head(env={
            **HEAD_ENV, "HOME": str(home), **{name: str(home / sub) for name, sub in (
                ("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local/share"),
                ("XDG_STATE_HOME", ".local/state"))},
            # Each worker's jobs start as fast as on a head of its own: a job's supervisor actor is a new Ray
            # worker process, and the raylet starts at most this many at once (its default: the head's 1 CPU;
            # Ray's raylet/main.cc: worker_maximum_startup_concurrency overrides it).
            "RAY_worker_maximum_startup_concurrency": workers})
        # The controller is this worker's parent under pytest-xdist (execnet's popen), else this process.
        owner = os.getppid() if under_xdist else os.getpid()
        subprocess.Popen([sys.executable, "-c", "import sys; from tests.ray_head import watch; "
                          "watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])",
                          str(owner), str(head.process.pid), str(head.temp_dir)],
                         cwd=REPO, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        record.write_text(json.dumps({"dashboard_url": head.dashboard_url, "pid": head.process.pid,
                                      "temp_dir": str(head.temp_dir)}))
        return head.dashboard_url


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The run's controller (the only process under `-n 0`) stops the shared head once every worker is done."""
    config = session.config
    if not hasattr(config, "workerinput") and hasattr(config, "_tmp_path_factory"):
        stop_shared_head(_run_folder(config))


def stop_shared_head(folder: Path) -> None:
    record = folder / SHARED_HEAD
    if record.is_file():
        found = json.loads(record.read_text())
        record.unlink()
        # As ray_cluster's: its state is thrown away, and a clean exit can take the whole grace.
        stop_head(RayHead(process=_Adopted(found["pid"]), dashboard_url=found["dashboard_url"],
                          temp_dir=Path(found["temp_dir"])), grace_s=5.0)


class _Adopted:
    """A head's leader that another pytest process may have started: signalled by pid, reaped if ours."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> None:
        with suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)

    def wait(self) -> None:
        with suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


WATCH_PERIOD_S = 2.0


def watch(owner: int, leader: int, temp_dir: str) -> None:
    """A process of its own beside the shared head: once the run's controller is gone (killed before its
    pytest_sessionfinish), ends the head's session; ends by itself once the head is stopped."""
    while _alive(owner) and _alive(leader):
        time.sleep(WATCH_PERIOD_S)
    if _alive(leader):
        with suppress(AssertionError):
            stop_head(RayHead(process=_Adopted(leader), dashboard_url="", temp_dir=Path(temp_dir)), grace_s=5.0)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class JobView:
    """A pytest worker's view of the run's shared head, on a port of its own: every request goes through
    unchanged (a log tail's websocket too), but the job list (GET /api/jobs/) names only the jobs submitted
    through this view. It stands in for the head each worker had to itself, as a stack's head is its own
    (one RayCluster per stack): what the product reads of every job on the head (a create refuses beside any
    live model export, components/job_gates.py; the run supervisor releases the GPU workers only once no
    job is live, workloads/run_lifecycle.py) then sees this worker's jobs only, never another worker's."""

    def __init__(self, head_url: str) -> None:
        self.head = urllib.parse.urlsplit(head_url)
        self.own: set[str] = set()
        handler = type("Relay", (_Relay,), {"view": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


VIEW_REQUEST_TIMEOUT_S = 120.0
"""Upper bound of one request the view passes on (the callers' own deadlines are shorter)."""
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
                "host", "accept-encoding", "proxy-connection"}


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    view: JobView

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 quiet, as the head's own log is
        pass

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if "upgrade" in self.headers.get("Connection", "").lower():
            self._tunnel(body or b"")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = http.client.HTTPConnection(self.view.head.hostname, self.view.head.port,
                                              timeout=VIEW_REQUEST_TIMEOUT_S)
        try:
            upstream.request(self.command, self.path, body, headers)
            reply = upstream.getresponse()
            data = reply.read()
        except OSError:
            self.send_error(502, f"the shared Ray head at {self.view.head.geturl()} did not answer")
            return
        finally:
            upstream.close()
        if urllib.parse.urlsplit(self.path).path.rstrip("/") == "/api/jobs" and reply.status == 200:
            if self.command == "POST":
                self.view.own.add(json.loads(data)["submission_id"])
            elif self.command == "GET":
                data = json.dumps([j for j in json.loads(data) if j.get("submission_id") in self.view.own]).encode()
        self.send_response(reply.status, reply.reason)
        for name, value in reply.getheaders():
            if name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _tunnel(self, body: bytes) -> None:
        """A websocket (a log tail): the request as it came, then bytes both ways until either side closes."""
        self.close_connection = True
        upstream = socket.create_connection((self.view.head.hostname, self.view.head.port), VIEW_REQUEST_TIMEOUT_S)
        upstream.settimeout(None)  # connected: the stream lasts as long as the caller follows it
        head = self.requestline + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()) + "\r\n"
        upstream.sendall(head.encode("latin-1") + body)

        def back() -> None:
            with suppress(OSError):
                while data := upstream.recv(65536):
                    self.wfile.write(data)
                    self.wfile.flush()
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        thread = threading.Thread(target=back, daemon=True)
        thread.start()
        with suppress(OSError, ValueError):
            while data := self.rfile.read1(65536):
                upstream.sendall(data)
        with suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=VIEW_REQUEST_TIMEOUT_S)
        upstream.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _relay


class FlakyLink:
    """A TCP relay to the real head that can be cut: a stand-in for a dropped port-forward or a
    head pod restart (a real head loses its jobs when restarted)."""

    def __init__(self, target_port: int) -> None:
        self.up = threading.Event()
        self._target = target_port
        self.drops = 0
        """Connections still to refuse while up: one failed request, then the head answers again."""
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if not self.up.is_set() or self.drops > 0:
                self.drops = max(0, self.drops - 1)
                conn.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self._target))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()

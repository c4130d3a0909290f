"""A real, private Ray head on 127.0.0.1 for the tests and the latency bench, and a TCP relay to
the head that can be cut (FlakyLink).

Loaded as a pytest plugin (`pytest_plugins = ["tests.ray_head"]` in tests/conftest.py). The head
runs as a child in its own process group with every port chosen free and its own temp dir, so it
collides with nothing else on the machine, and it is ended through that group: `ray stop` would
end every Ray process on the machine.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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

    process: subprocess.Popen[bytes]
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
    with open(PORT_LOCK, "a") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another Ray node start held {PORT_LOCK} for over {timeout_s:g} s") from None
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


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayHead]:
    """A head of the test module's own (0 GPUs) that nodes join and leave with `start_node`; each
    test stops the nodes it started."""
    head = start_head(env=MULTI_NODE_ENV)
    try:
        yield head
    finally:
        # Its state is thrown away: no need to let it shut down cleanly.
        stop_head(head, grace_s=5.0)


@pytest.fixture(scope="session")
def ray_head() -> Iterator[str]:
    """The dashboard URL of a real Ray head on 127.0.0.1, shared by the session."""
    head = start_head()
    try:
        yield head.dashboard_url
    finally:
        # As ray_cluster's: its state is thrown away, and a clean exit can take the whole grace.
        stop_head(head, grace_s=5.0)


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

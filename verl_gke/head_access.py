"""How a client reaches the Ray dashboard of the training cluster, never through a public endpoint.

Two ways, chosen by `dashboard(...)`:
- `dashboard_url` given (a privately exposed dashboard, or a local head in tests): used as is.
- otherwise `kubectl port-forward` to the head service through the Kubernetes API, with a
  throw-away kubeconfig built from the cluster's endpoint (and CA, for an IP endpoint; no credential in it: the
  gke-gcloud-auth-plugin fetches a token at use time), on 127.0.0.1 and a port no browser connects to,
  behind a LocalProxy of this process (verl_gke/local_proxy.py) that admits only requests carrying its
  session's secret, for its own Host, from no other site; it adds the Ray cluster's token where the
  cluster has token authentication. Both live exactly as long as the block.

Used by the GrpoJob provider and the CLI:

    with dashboard(None, cluster_endpoint=ep, cluster_ca_certificate=ca, cluster_name="c",
                   namespace="ray", head_service="b200-ray-cluster-head-svc") as url:
        wait_for_dashboard(url, timeout_s=60)
        JobSubmissionClient(url).list_jobs()
"""

from __future__ import annotations

import base64
import collections
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from manifests.ray_cluster import DASHBOARD_PORT, ray_cluster_of
from verl_gke.kubeconfig import gke_kubeconfig, is_dns_endpoint
from verl_gke.local_proxy import BROWSER_BLOCKED_PORTS, LocalProxy

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

PORT_FORWARD_START_TIMEOUT_S = 60.0
"""How long kubectl may take to authenticate and open the tunnel before we give up."""

_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+) ->")
_STOP_GRACE_S = 5.0
_ERROR_LINES = 10


class HeadAccessError(RuntimeError):
    """The Ray dashboard cannot be reached; the message says where and why."""


class HeadAccessSetupError(HeadAccessError):
    """kubectl or a cluster fact is missing: retrying cannot help."""


class HeadRequestError(RuntimeError):
    """The head took a request and did not answer in time, or broke the connection: it may be
    alive, so this never counts as the head being gone."""


class HeadGoneError(HeadAccessError):
    """The Kubernetes API says the head's service (or its namespace) does not exist."""


# kubectl's words for an object the API server does not have: `services "x" not found`,
# `Error from server (NotFound): namespaces "x" not found`.
_NOT_FOUND = re.compile(r'(?:services|namespaces) "[^"]+" not found')


REQUEST_TIMEOUT_S = 30.0
"""Deadline of each request to the Ray job API (connect and read): Ray's client sets none, and a
head that accepts a connection and never answers would block its caller for good."""


OUTAGE_WINDOW_S = 600.0
"""How long a long wait (jobWaitForCompletion, `verl-gke wait`) rides out a lost head: a head pod
restart or a dropped port-forward takes a minute or two."""


class OutageClock:
    """How long the head has been out of reach, for a long wait that rides out short outages."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._since: float | None = None

    def reached(self) -> None:
        self._since = None

    def lost(self) -> float:
        """Seconds out of reach so far (the clock starts at the first loss)."""
        now = time.monotonic()
        self._since = self._since or now
        return now - self._since

    def left(self) -> float | None:
        """Seconds of the window left, or None while the head is in reach."""
        return None if self._since is None else self.window_s - (time.monotonic() - self._since)


def job_client(url: str, address: str) -> JobSubmissionClient:
    """Ray's JobSubmissionClient on `url` with a deadline on every request; a stall or a broken
    connection raises HeadRequestError naming `address` and the request."""
    import requests
    from ray.job_submission import JobSubmissionClient

    class BoundedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> requests.Response:
            kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
            try:
                return super()._do_request(method, endpoint, **kwargs)
            except (requests.Timeout, requests.ConnectionError) as e:
                raise HeadRequestError(
                    f"Ray head at {address}: {method} {endpoint} got no answer within "
                    f"{kwargs['timeout']:g} s ({type(e).__name__})") from None

    return BoundedClient(url)


def dashboard_command(stack: str) -> str:
    """The command a person runs to open the dashboard: `verl-gke dashboard`, whose URL holds a secret
    of its session, not a bare `kubectl port-forward` whose port any web page in the browser could
    reach (the Job API of Ray before 2.52 has no authentication)."""
    return shlex.join(["verl-gke", "dashboard", "--stack", stack])


def shown(url: str) -> str:
    """`url` as messages show it: without the local proxy's session secret (its path)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.path.strip("/") else url.rstrip("/")


def wait_for_dashboard(url: str, timeout_s: float) -> None:
    """Polls `GET <url>/api/version` until it answers 200, for at most `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    probe = f"{url.rstrip('/')}/api/version"
    last_error = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HeadAccessError(
                f"Ray dashboard at {shown(url)} did not answer GET /api/version within {timeout_s:g} s "
                f"(last error: {last_error})"
            )
        try:
            with urllib.request.urlopen(probe, timeout=max(0.1, min(5.0, left))) as response:
                if response.status == 200:
                    return
                last_error = f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            if error.code == 401:  # no retry brings a token
                raise HeadAccessSetupError(
                    f"Ray dashboard at {shown(url)} answered GET /api/version with 401 Unauthorized: the Ray cluster "
                    "has token authentication; reach it through the port-forward (no --dashboard-url or "
                    "verl-gke:jobDashboardUrl), which adds the cluster's token, with an account that may read the "
                    "Secret named after the RayCluster (key auth_token)"
                ) from None
            last_error = f"HTTP {error.code}"
        except (OSError, ValueError) as error:  # refused, reset, timed out, bad URL
            last_error = str(getattr(error, "reason", error))
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


@contextmanager
def dashboard(
    dashboard_url: str | None,
    *,
    cluster_endpoint: str | None,
    cluster_ca_certificate: str | None,
    cluster_name: str | None,
    namespace: str,
    head_service: str | None,
    port: int = DASHBOARD_PORT,
    start_timeout_s: float = PORT_FORWARD_START_TIMEOUT_S,
) -> Iterator[str]:
    """Yields an http URL of the Ray dashboard for the duration of the block.

    `dashboard_url` is yielded as is when given. Otherwise a `kubectl port-forward` to
    `svc/<head_service>` runs for the block, with a temporary kubeconfig (mode 0600, deleted on
    exit); it is always terminated on exit. Raises HeadAccessSetupError when kubectl or a cluster
    fact is missing, HeadAccessError when the tunnel does not open within `start_timeout_s`.
    """
    if dashboard_url:
        yield dashboard_url.rstrip("/")
        return
    facts = {"cluster_endpoint": cluster_endpoint, "cluster_ca_certificate": cluster_ca_certificate,
             "cluster_name": cluster_name, "head_service": head_service}
    if cluster_endpoint and is_dns_endpoint(cluster_endpoint):
        del facts["cluster_ca_certificate"]  # the DNS endpoint's certificate is publicly trusted
    missing = [key for key, value in facts.items() if not value]
    if missing:
        raise HeadAccessSetupError(
            f"cannot reach the Ray dashboard: give dashboard_url, or all of cluster_endpoint, "
            f"cluster_ca_certificate (for an IP endpoint), cluster_name and head_service "
            f"(missing: {', '.join(missing)})"
        )
    assert cluster_endpoint and cluster_name and head_service
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise HeadAccessSetupError(
            "kubectl not found on PATH: it is needed to port-forward to the Ray head service "
            "(install kubectl and gke-gcloud-auth-plugin, or give dashboard_url)"
        )
    with tempfile.TemporaryDirectory(prefix="verl-gke-") as workdir:
        kubeconfig = Path(workdir) / "kubeconfig"
        _write_private(kubeconfig, gke_kubeconfig(cluster_name, cluster_endpoint, cluster_ca_certificate))
        target = f"svc/{head_service} in namespace {namespace} of cluster {cluster_name}"
        token = _ray_token(kubectl, kubeconfig, namespace, head_service, target, start_timeout_s)
        command = [kubectl, "port-forward", f"svc/{head_service}", f"{_blocked_free_port()}:{port}", "-n", namespace,
                   "--address", "127.0.0.1", "--kubeconfig", str(kubeconfig)]
        with _PortForward(command, target, start_timeout_s) as local_port, LocalProxy(local_port, token) as url:
            yield url


def _blocked_free_port() -> int:
    """A port of BROWSER_BLOCKED_PORTS nothing listens on yet, for kubectl's end of the forward."""
    for port in BROWSER_BLOCKED_PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise HeadAccessError(f"every port browsers refuse ({', '.join(map(str, BROWSER_BLOCKED_PORTS))}) is in use "
                          "on 127.0.0.1: close other verl-gke commands, or port-forwards, that hold them")


def _ray_token(kubectl: str, kubeconfig: Path, namespace: str, head_service: str, target: str,
               timeout_s: float) -> str | None:
    """The Ray cluster's token where it has token authentication, else None: KubeRay 1.6 keeps it in the
    Secret named after the RayCluster, key `auth_token` (ray-operator/controllers/ray/raycluster_controller.go,
    reconcileAuthSecret), which exists only then."""
    command = [kubectl, "get", "secret", ray_cluster_of(head_service), "-n", namespace, "--kubeconfig",
               str(kubeconfig), "--ignore-not-found", "-o", "jsonpath={.data.auth_token}"]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise HeadAccessError(f"kubectl get secret for {target} did not answer within {timeout_s:g} s") from None
    error = done.stderr.decode(errors="replace").strip()
    if done.returncode != 0 and ("forbidden" in error.lower() or "not found" in error.lower()):
        # Not yours to read (a head that wants a token then says so itself, HTTP 401), or no such
        # namespace (the port-forward then names what is gone).
        return None
    if done.returncode != 0:
        raise HeadAccessError(f"kubectl get secret for {target} exited with status {done.returncode}: {error[-300:]}")
    encoded = done.stdout.strip()
    return base64.b64decode(encoded).decode() if encoded else None


def _write_private(path: Path, text: str) -> None:
    """Writes a file readable by its owner only, with that mode from its creation on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the kubectl child: end when the thread that started it dies, even by SIGKILL (an engine
    cancelling the provider), so no port-forward outlives its caller. The child lives only within
    one call on that thread."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _PortForward:
    """A kubectl port-forward child: started on enter, always terminated on exit.

    Its output is drained by two threads for its whole life: kubectl prints a line per
    connection, and a full pipe would block it.
    """

    def __init__(self, command: list[str], target: str, start_timeout_s: float) -> None:
        self._command = command
        self._target = target
        self._start_timeout_s = start_timeout_s
        self._port: int | None = None
        self._ready = threading.Event()
        self._errors: collections.deque[str] = collections.deque(maxlen=_ERROR_LINES)
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> int:
        self._process = subprocess.Popen(self._command, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         preexec_fn=_die_with_parent)
        assert self._process.stdout and self._process.stderr
        readers = [threading.Thread(target=self._read_stdout, args=(self._process.stdout,), daemon=True),
                   threading.Thread(target=self._read_stderr, args=(self._process.stderr,), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            if not self._ready.wait(self._start_timeout_s):
                raise HeadAccessError(
                    f"kubectl port-forward to {self._target} did not open within "
                    f"{self._start_timeout_s:g} s{self._error_tail()}"
                )
            if self._port is None:
                for reader in readers:
                    reader.join(timeout=_STOP_GRACE_S)
                gone = any(_NOT_FOUND.search(line) for line in self._errors)
                raise (HeadGoneError if gone else HeadAccessError)(
                    f"kubectl port-forward to {self._target} exited with status "
                    f"{self._process.wait()}{self._error_tail()}"
                )
        except BaseException:
            self._stop()
            raise
        return self._port

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _read_stdout(self, stream: IO[bytes]) -> None:
        for line in stream:
            match = _FORWARDING.search(line)
            if match and self._port is None:
                self._port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # EOF: kubectl exited; __enter__ reports it

    def _read_stderr(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._errors.append(line.decode(errors="replace").rstrip())

    def _error_tail(self) -> str:
        lines = [line for line in self._errors if line]
        return (": " + " | ".join(lines)) if lines else ""

    def _stop(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

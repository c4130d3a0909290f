"""How the GrpoJob provider and the CLI reach the Ray dashboard, never through a public endpoint.

`dashboard(...)` yields a URL: `dashboard_url` as given (a private dashboard, a test's head), or a
LocalProxy of this process (access/local_proxy.py) on a random 127.0.0.1 port that admits only its
session's requests and opens for each a port-forward stream to the head pod through the cluster's
API (access/pod_forward.py), adding the Ray cluster's token where it has one; nothing else listens.
It lives exactly as long as the block (docs/security.md, A2).
"""

from __future__ import annotations

import base64
import shlex
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from manifests.ray_cluster import DASHBOARD_PORT, ray_cluster_of
from access.local_proxy import LocalProxy
from access.pod_forward import ForwardError, ForwardGone, PodForward
from workloads.kube import KubernetesApi

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient


class HeadAccessError(RuntimeError):
    """The Ray dashboard cannot be reached; the message says where and why."""


class HeadAccessSetupError(HeadAccessError):
    """gke-gcloud-auth-plugin or a cluster fact is missing: retrying cannot help."""


class HeadRequestError(RuntimeError):
    """The head took a request and did not answer in time, or broke the connection: it may be
    alive, so this never counts as the head being gone."""


class HeadGoneError(HeadAccessError):
    """The Kubernetes API says the head's service (or its namespace) does not exist."""


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
    api: KubernetesApi | None,
    namespace: str,
    head_service: str | None,
    port: int = DASHBOARD_PORT,
) -> Iterator[str]:
    """Yields an http URL of the Ray dashboard for the duration of the block.

    `dashboard_url` is yielded as is when given. Otherwise a LocalProxy of this process, whose every
    admitted connection is a port-forward stream to `svc/<head_service>` through `api` (the cluster's
    API; access.pod_forward): nothing else listens. Raises HeadAccessSetupError when a cluster fact
    is missing, HeadGoneError when the API has no such service, HeadAccessError when its head pod is
    not running or the API does not answer.
    """
    if dashboard_url:
        yield dashboard_url.rstrip("/")
        return
    if api is None or not head_service:
        raise HeadAccessSetupError(
            "cannot reach the Ray dashboard: give dashboard_url, or the cluster's API (cluster_endpoint, and "
            "cluster_ca_certificate for an IP endpoint) and head_service")
    forward = PodForward(api, namespace, head_service, port)
    target = f"svc/{head_service} in namespace {namespace}"
    try:
        forward.resolve()
        token = _ray_token(forward, ray_cluster_of(head_service))
        if token:
            _check_refuses_without_token(forward, target)
    except ForwardGone as error:
        raise HeadGoneError(f"port-forward to {target}: {error}") from None
    except OSError as error:  # ForwardError, or the head's pod side timing out
        raise HeadAccessError(f"port-forward to {target}: {error}") from None
    with LocalProxy(forward.connect, token) as url:
        yield url


def _check_refuses_without_token(forward: PodForward, target: str) -> None:
    """A cluster with a token must have a head that refuses a call without it: the RayCluster's
    rayVersion is only a claim about its image (an image whose Ray ignores RAY_AUTH_MODE would run
    any job submitted to it)."""
    stream = forward.connect(REQUEST_TIMEOUT_S)
    try:
        stream.sendall(b"GET /api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while b"\r\n" not in answer and len(answer) < 4096:
            chunk = stream.recv(4096)
            if not chunk:
                break
            answer += chunk
    finally:
        stream.close()
    status = answer.split(b"\r\n", 1)[0].decode("latin-1")
    if not status.startswith("HTTP/1."):
        raise ForwardError(f"the Ray head gave no HTTP answer to a call without the token ({status[:80]!r})")
    if status.split(" ")[1].startswith("2"):
        raise HeadAccessSetupError(
            f"the Ray head of {target} answered GET /api/jobs/ without the cluster's token ({status}): its token "
            "authentication is off, so anyone who reaches 8265 could run jobs. Check the Ray version of verlImage "
            "(rayVersion claims >= 2.52) and its RAY_AUTH_MODE")


def _ray_token(forward: PodForward, ray_cluster: str) -> str | None:
    """The Ray cluster's token where it has token authentication, else None: KubeRay 1.6 keeps it in the
    Secret named after the RayCluster, key `auth_token` (ray-operator/controllers/ray/raycluster_controller.go,
    reconcileAuthSecret), which exists only then. A Secret not yours to read counts as none (a head
    that wants a token then says so itself, HTTP 401)."""
    try:
        secret = forward.api.request("GET", f"/api/v1/namespaces/{forward.namespace}/secrets/{ray_cluster}")
    except urllib.error.HTTPError as error:
        if error.code == 403:
            return None
        raise ForwardError(f"GET secret {ray_cluster}: HTTP {error.code}") from None
    except (OSError, ValueError) as error:
        raise ForwardError(f"GET secret {ray_cluster}: {getattr(error, 'reason', error)}") from None
    encoded = ((secret or {}).get("data") or {}).get("auth_token")
    return base64.b64decode(encoded).decode() if encoded else None

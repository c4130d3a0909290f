"""access.kubeconfig and access.head_access: how clients reach the Ray dashboard.

The port-forward path goes through the Kubernetes API stand-in (tests/kube_api.py), whose
pods/portforward WebSocket reaches a real Ray head on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.kube_api import kube_api
from tests.ray_head import free_ports
from access.head_access import (
    HeadAccessError,
    HeadAccessSetupError,
    HeadGoneError,
    dashboard,
    dashboard_command,
    wait_for_dashboard,
)
from access.kubeconfig import gke_kubeconfig, is_dns_endpoint
from workloads.kube import KubernetesApi

CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


def test_kubeconfig_authenticates_with_the_gke_auth_plugin_only() -> None:
    config = yaml.safe_load(gke_kubeconfig("verl", "34.1.2.3", CA))
    assert config["apiVersion"] == "v1" and config["kind"] == "Config"
    assert config["clusters"] == [{"name": "verl", "cluster": {
        "server": "https://34.1.2.3", "certificate-authority-data": CA}}]
    assert config["contexts"] == [{"name": "verl", "context": {"cluster": "verl", "user": "verl"}}]
    assert config["current-context"] == "verl"
    [user] = config["users"]
    assert user["name"] == "verl"
    # The exec plugin and nothing else: no token, password or client key in the file.
    assert list(user["user"]) == ["exec"]
    plugin = user["user"]["exec"]
    assert plugin["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert plugin["command"] == "gke-gcloud-auth-plugin"
    assert plugin["provideClusterInfo"] is True
    assert "gke-gcloud-auth-plugin" in plugin["installHint"]


def test_kubeconfig_keeps_an_https_endpoint_and_rejects_an_empty_one() -> None:
    config = yaml.safe_load(gke_kubeconfig("c", "https://10.0.0.2", CA))
    assert config["clusters"][0]["cluster"]["server"] == "https://10.0.0.2"
    with pytest.raises(ValueError, match="endpoint must be a non-empty string"):
        gke_kubeconfig("c", "", CA)


DNS_ENDPOINT = "gke-1a2b3c4d5e6f4a5b8c9d0e1f2a3b4c5d6e7f-123456789012.us-central1.gke.goog"


@pytest.mark.parametrize("endpoint", [DNS_ENDPOINT, f"https://{DNS_ENDPOINT}"])
@pytest.mark.parametrize("ca", [CA, None])
def test_kubeconfig_for_the_dns_endpoint_trusts_the_public_roots_not_the_cluster_ca(endpoint: str,
                                                                                    ca: str | None) -> None:
    # gcloud container clusters get-credentials --dns-endpoint writes the server and no CA: the DNS
    # endpoint's certificate is publicly trusted, not signed by the cluster CA.
    config = yaml.safe_load(gke_kubeconfig("verl", endpoint, ca))
    assert config["clusters"] == [{"name": "verl", "cluster": {"server": f"https://{DNS_ENDPOINT}"}}]
    assert list(config["users"][0]["user"]) == ["exec"]


def test_kubeconfig_for_an_ip_endpoint_needs_the_ca() -> None:
    with pytest.raises(ValueError, match="ca_certificate must be a non-empty string, got None"):
        gke_kubeconfig("c", "34.1.2.3", None)


def test_is_dns_endpoint_tells_a_host_name_from_an_address() -> None:
    assert [is_dns_endpoint(e) for e in (DNS_ENDPOINT, f"https://{DNS_ENDPOINT}:443", "34.1.2.3",
                                         "https://10.0.0.2", "https://[2001:db8::1]")] == [True, True, False, False,
                                                                                            False]


def test_the_dashboard_command_is_the_clis_never_a_bare_port_forward() -> None:
    assert dashboard_command("a4") == "verl-gke dashboard --stack a4"
    assert dashboard_command("my stack") == "verl-gke dashboard --stack 'my stack'"


def test_a_given_dashboard_url_is_yielded_as_is() -> None:
    with dashboard("http://127.0.0.1:8265/", api=None, namespace="default", head_service=None) as url:
        assert url == "http://127.0.0.1:8265"


@pytest.mark.ray
def test_wait_for_dashboard_returns_once_the_real_head_answers(ray_head: str) -> None:
    started = time.monotonic()
    wait_for_dashboard(ray_head, timeout_s=30)
    assert time.monotonic() - started < 5


def test_wait_for_dashboard_on_a_closed_port_times_out_naming_the_address() -> None:
    [port] = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(HeadAccessError) as raised:
        wait_for_dashboard(url, timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 5
    assert f"Ray dashboard at {url} did not answer GET /api/version within 1.5 s" in str(raised.value)


def _listeners_of_this_process() -> set[int]:
    """The loopback TCP ports this process listens on (/proc/net/tcp state 0A, by socket inode)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            ports.add(int(fields[1].split(":")[1], 16))
    return ports


def _children() -> set[int]:
    return {int(pid) for task in Path("/proc/self/task").iterdir()
            for pid in (task / "children").read_text().split()}


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.ray
def test_no_local_listener_reaches_the_job_api_without_the_secret(ray_head: str) -> None:
    """Why 1: kubectl port-forward's loopback port answered any local process (a direct request
    returned 200). Now the only listener of the whole block is the proxy, which wants the secret;
    the head is reached by a port-forward stream per connection, through the API server."""
    with kube_api() as (api_url, state):
        state.add_head("ray", "head-svc", "head-0", int(ray_head.rsplit(":", 1)[1]))
        before, children = _listeners_of_this_process(), _children()
        with dashboard(None, api=KubernetesApi(api_url), namespace="ray", head_service="head-svc") as url:
            opened = _listeners_of_this_process() - before
            proxy_port = int(urllib.parse.urlsplit(url).port or 0)
            assert opened == {proxy_port}
            assert _children() == children  # no kubectl, nothing else that could listen
            assert _get(f"http://127.0.0.1:{proxy_port}/api/version")[0] == 403
            assert _get(f"http://127.0.0.1:{proxy_port}/api/jobs/")[0] == 403
            assert state.forwards == []  # refused before any stream to the head opened
            status, body = _get(f"{url}/api/version")
            assert status == 200 and json.loads(body)["ray_version"]
            assert state.forwards == ["/api/v1/namespaces/ray/pods/head-0"]
        assert _listeners_of_this_process() - before == set()


def test_a_missing_head_service_is_the_head_gone_and_a_pending_head_is_not_yet_reachable() -> None:
    with kube_api() as (api_url, state):
        with pytest.raises(HeadGoneError, match='^port-forward to svc/head-svc in namespace ray: '
                                                'services "head-svc" not found$'):
            with dashboard(None, api=KubernetesApi(api_url), namespace="ray", head_service="head-svc"):
                pytest.fail("the block must not run")
        state.add_head("ray", "head-svc", "head-0", 1)
        state.objects["/api/v1/namespaces/ray/pods/head-0"]["status"]["phase"] = "Pending"
        with pytest.raises(HeadAccessError) as raised:
            with dashboard(None, api=KubernetesApi(api_url), namespace="ray", head_service="head-svc"):
                pytest.fail("the block must not run")
        assert not isinstance(raised.value, HeadGoneError)
        assert str(raised.value) == ("port-forward to svc/head-svc in namespace ray: no running pod behind "
                                     "svc/head-svc (the head is not up yet)")


def test_missing_cluster_facts_are_named() -> None:
    with pytest.raises(HeadAccessSetupError, match=r"give dashboard_url, or the cluster's API \(cluster_endpoint, "
                                                   r"and cluster_ca_certificate for an IP endpoint\) and head_service"):
        with dashboard(None, api=None, namespace="ray", head_service="head-svc"):
            pytest.fail("the block must not run")


def test_the_ray_token_from_kurays_secret_reaches_the_head_and_a_dead_pod_side_is_a_502() -> None:
    """KubeRay 1.6 keeps the token of a RayCluster with token authentication in the Secret named after
    it, key auth_token; the proxy adds it to each request it forwards, never the caller."""
    seen: list[str | None] = []

    class Head(BaseHTTPRequestHandler):
        """Ray >= 2.52 with RAY_AUTH_MODE=token: 401 without `Authorization: Bearer <token>`."""
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer tok-123"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"no")

        def log_message(self, *args: object) -> None:
            pass

    head = ThreadingHTTPServer(("127.0.0.1", 0), Head)
    threading.Thread(target=head.serve_forever, daemon=True).start()
    try:
        with kube_api() as (api_url, state):
            state.add_head("ray", "verl-head-svc", "verl-head-0", head.server_port)
            state.put_object("/api/v1/namespaces/ray/secrets/verl", {"apiVersion": "v1", "kind": "Secret",
                             "metadata": {"name": "verl", "namespace": "ray"},
                             "data": {"auth_token": base64.b64encode(b"tok-123").decode()}})
            with dashboard(None, api=KubernetesApi(api_url), namespace="ray", head_service="verl-head-svc") as url:
                assert _get(f"{url}/api/version", {"Authorization": "Bearer mine"}) == (200, b"ok")
                state.forward_to.clear()  # the pod side refuses now
                status, body = _get(f"{url}/api/version")
                assert status == 502 and b"connection refused" in body
        assert seen == [None, "Bearer tok-123"]  # dashboard()'s own call without the token first
    finally:
        head.shutdown()
        head.server_close()


@pytest.mark.ray
def test_a_head_that_answers_without_the_clusters_token_is_refused(ray_head: str) -> None:
    """Why 6: token authentication was trusted from rayVersion alone. A cluster with KubeRay's token
    Secret whose head (here a real Ray without RAY_AUTH_MODE) answers a call without it is refused."""
    with kube_api() as (api_url, state):
        state.add_head("ray", "verl-head-svc", "verl-head-0", int(ray_head.rsplit(":", 1)[1]))
        state.put_object("/api/v1/namespaces/ray/secrets/verl", {"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": "verl", "namespace": "ray"},
                         "data": {"auth_token": base64.b64encode(b"tok-123").decode()}})
        with pytest.raises(HeadAccessSetupError) as raised:
            with dashboard(None, api=KubernetesApi(api_url), namespace="ray", head_service="verl-head-svc"):
                pytest.fail("the block must not run")
    assert str(raised.value) == (
        "the Ray head of svc/verl-head-svc in namespace ray answered GET /api/jobs/ without the cluster's token "
        "(HTTP/1.1 200 OK): its token authentication is off, so anyone who reaches 8265 could run jobs. Check the "
        "Ray version of verlImage (rayVersion claims >= 2.52) and its RAY_AUTH_MODE")

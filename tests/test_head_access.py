"""verl_gke.kubeconfig and verl_gke.head_access: how clients reach the Ray dashboard.

The port-forward path is driven through a fake `kubectl` put first on PATH: it prints kubectl's
"Forwarding from" line and serves nothing. That fakes kubectl only; Ray is always real.
"""

from __future__ import annotations

import base64
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import yaml

from tests.ray_head import free_ports, kubectl_record
from verl_gke.local_proxy import BROWSER_BLOCKED_PORTS
from verl_gke.head_access import (
    HeadAccessError,
    HeadAccessSetupError,
    dashboard,
    dashboard_command,
    wait_for_dashboard,
)
from verl_gke.kubeconfig import gke_kubeconfig, is_dns_endpoint

CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


def _forward(start_timeout_s: float = 60.0) -> AbstractContextManager[str]:
    """The port-forward way to svc/head-svc in namespace ray of cluster verl."""
    return dashboard(None, cluster_endpoint="34.1.2.3", cluster_ca_certificate=CA, cluster_name="verl",
                     namespace="ray", head_service="head-svc", start_timeout_s=start_timeout_s)


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


def test_port_forward_to_the_dns_endpoint_needs_no_ca(fake_kubectl: Path) -> None:
    with dashboard(None, cluster_endpoint=DNS_ENDPOINT, cluster_ca_certificate=None, cluster_name="verl",
                   namespace="ray", head_service="head-svc") as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/[\w-]{43}", url)
    written = yaml.safe_load(Path(f"{fake_kubectl}.kubeconfig").read_text())
    assert written["clusters"] == [{"name": "verl", "cluster": {"server": f"https://{DNS_ENDPOINT}"}}]


def test_port_forward_to_an_ip_endpoint_without_a_ca_is_refused(fake_kubectl: Path) -> None:
    with pytest.raises(HeadAccessSetupError, match=r"\(missing: cluster_ca_certificate\)"):
        with dashboard(None, cluster_endpoint="34.1.2.3", cluster_ca_certificate=None, cluster_name="verl",
                       namespace="ray", head_service="head-svc"):
            pytest.fail("the block must not run")
    assert not fake_kubectl.exists()


def test_the_dashboard_command_is_the_clis_never_a_bare_port_forward() -> None:
    assert dashboard_command("a4") == "verl-gke dashboard --stack a4"
    assert dashboard_command("my stack") == "verl-gke dashboard --stack 'my stack'"


def test_a_given_dashboard_url_is_yielded_as_is() -> None:
    with dashboard("http://127.0.0.1:8265/", cluster_endpoint=None, cluster_ca_certificate=None,
                   cluster_name=None, namespace="default", head_service=None) as url:
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


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_port_forward_runs_kubectl_on_loopback_with_a_private_kubeconfig(fake_kubectl: Path) -> None:
    with _forward() as url:
        # The block gets the local proxy's URL, with its session's secret, never kubectl's port.
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/[\w-]{43}", url) and ":45678" not in url
        seen = kubectl_record(fake_kubectl)
        kubeconfig = Path(seen["kubeconfig"][0])
        # kubectl's end on a port every browser refuses (verl_gke/local_proxy.py).
        assert seen["arg"] == ["port-forward", "svc/head-svc", seen["arg"][2], "-n", "ray",
                               "--address", "127.0.0.1", "--kubeconfig", str(kubeconfig)]
        assert int(seen["arg"][2].removesuffix(":8265")) in BROWSER_BLOCKED_PORTS
        assert seen["mode"] == ["600"]
        assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
        pid = int(seen["pid"][0])
        assert _alive(pid)
    assert not kubeconfig.exists()
    assert not _alive(pid)
    written = yaml.safe_load(Path(f"{fake_kubectl}.kubeconfig").read_text())
    assert written == yaml.safe_load(gke_kubeconfig("verl", "34.1.2.3", CA))


def test_port_forward_is_terminated_when_the_block_raises(fake_kubectl: Path) -> None:
    with pytest.raises(RuntimeError, match="inside the block"):
        with _forward():
            pid = int(kubectl_record(fake_kubectl)["pid"][0])
            raise RuntimeError("inside the block")
    assert not _alive(pid)


def test_kubectl_failing_is_reported_with_its_error_line(fake_kubectl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KUBECTL_MODE", "fail")
    with pytest.raises(HeadAccessError) as raised:
        with _forward():
            pytest.fail("the block must not run")
    message = str(raised.value)
    assert "kubectl port-forward to svc/head-svc in namespace ray of cluster verl exited with status 1" in message
    assert 'services "head-svc" not found' in message
    assert not Path(kubectl_record(fake_kubectl)["kubeconfig"][0]).exists()


def test_kubectl_that_never_forwards_times_out_and_is_killed(fake_kubectl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KUBECTL_MODE", "silent")
    started = time.monotonic()
    with pytest.raises(HeadAccessError, match=r"did not open within 1 s"):
        with _forward(start_timeout_s=1):
            pytest.fail("the block must not run")
    assert time.monotonic() - started < 10
    assert not _alive(int(kubectl_record(fake_kubectl)["pid"][0]))


def test_missing_kubectl_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HeadAccessSetupError) as raised:
        with _forward():
            pytest.fail("the block must not run")
    message = str(raised.value)
    assert message.startswith("kubectl not found on PATH")
    assert "\n" not in message


def test_missing_cluster_facts_are_named() -> None:
    with pytest.raises(HeadAccessSetupError) as raised:
        with dashboard(None, cluster_endpoint="34.1.2.3", cluster_ca_certificate=None,
                       cluster_name="verl", namespace="ray", head_service=None):
            pytest.fail("the block must not run")
    assert "(missing: cluster_ca_certificate, head_service)" in str(raised.value)


def test_a_port_forward_ends_with_the_process_that_opened_it_even_on_sigkill(
        fake_kubectl: Path) -> None:
    # A stand-in for the provider process, killed without a chance to clean up.
    opener = subprocess.Popen([sys.executable, "-c", (
        "from verl_gke.head_access import dashboard\n"
        "import time\n"
        "with dashboard(None, cluster_endpoint='34.1.2.3', cluster_ca_certificate='Y2E=', cluster_name='c',"
        " namespace='ray', head_service='h-svc') as url:\n"
        "    print(url, flush=True); time.sleep(300)\n")], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent)
    try:
        assert opener.stdout is not None and opener.stdout.readline().startswith("http://127.0.0.1:")
        kubectl_pid = int(kubectl_record(fake_kubectl)["pid"][0])
        opener.send_signal(signal.SIGKILL)
        opener.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(kubectl_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(kubectl_pid)
    finally:
        if opener.poll() is None:
            opener.kill()


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_taken_browser_refused_port_is_passed_over(fake_kubectl: Path) -> None:
    with _forward():
        first = int(kubectl_record(fake_kubectl)["arg"][2].removesuffix(":8265"))
    with socket.create_server(("127.0.0.1", first)):
        with _forward():
            taken_over = int(kubectl_record(fake_kubectl)["arg"][2].removesuffix(":8265"))
    assert taken_over != first and taken_over in BROWSER_BLOCKED_PORTS


def test_the_ray_token_is_read_from_the_secret_kuberay_keeps(fake_kubectl: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """KubeRay 1.6 keeps the token of a RayCluster with token authentication in the Secret named after
    it, key auth_token; none exists otherwise (--ignore-not-found: nothing printed, no token)."""
    from verl_gke import head_access

    seen: list[str | None] = []
    real = head_access.LocalProxy
    monkeypatch.setattr(head_access, "LocalProxy", lambda port, token: seen.append(token) or real(port, token))
    with _forward():
        pass
    monkeypatch.setenv("FAKE_KUBECTL_SECRET", base64.b64encode(b"tok-123").decode())
    with _forward():
        pass
    assert seen == [None, "tok-123"]
    get = Path(f"{fake_kubectl}.get").read_text().split("\n")
    assert [line.removeprefix("arg ") for line in get[:5]] == ["get", "secret", "head-svc", "-n", "ray"]
    assert "jsonpath={.data.auth_token}" in Path(f"{fake_kubectl}.get").read_text()

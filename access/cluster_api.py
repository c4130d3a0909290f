"""The cluster's API for the run record (workloads.kube.KubernetesApi), with no credential of
its own: the token comes from gke-gcloud-auth-plugin at each request, as kubectl gets one."""

from __future__ import annotations

import base64
import json
import subprocess

from access.head_access import HeadAccessError, HeadAccessSetupError
from access.kubeconfig import AUTH_PLUGIN, AUTH_PLUGIN_INSTALL_HINT, is_dns_endpoint
from workloads.kube import KubernetesApi

TOKEN_TIMEOUT_S = 30.0
"""How long gke-gcloud-auth-plugin may take to give a token."""


def gke_token() -> str:
    """A token for the GKE API from gke-gcloud-auth-plugin, as kubectl gets one (no credential is kept)."""
    try:
        done = subprocess.run([AUTH_PLUGIN], capture_output=True, text=True, timeout=TOKEN_TIMEOUT_S, check=True)
    except FileNotFoundError:
        raise HeadAccessSetupError(f"{AUTH_PLUGIN} not found on PATH. {AUTH_PLUGIN_INSTALL_HINT}") from None
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise HeadAccessError(f"{AUTH_PLUGIN} gave no token: {error}") from None
    return str(json.loads(done.stdout)["status"]["token"])


def cluster_api(endpoint: str, ca_certificate: str | None, timeout_s: float) -> KubernetesApi:
    """The cluster's API at `endpoint` with the user's Google credentials. The DNS endpoint's
    certificate is publicly trusted (system roots); the IP endpoint's is the cluster CA's (base64
    `ca_certificate`, required then)."""
    server = endpoint if endpoint.startswith("https://") else f"https://{endpoint}"
    ca = None if is_dns_endpoint(endpoint) else base64.b64decode(ca_certificate or "").decode()
    return KubernetesApi(server, token=gke_token, ca_data=ca, timeout_s=timeout_s)

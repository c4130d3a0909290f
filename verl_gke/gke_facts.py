"""The cluster's endpoint and CA as GKE itself states them, never as a file says.

A kubeconfig sends the user's Google access token (through gke-gcloud-auth-plugin) to whatever
server it names; an outputs file is only a claim about which cluster to use. So the CLI keeps the
cluster's name and location from the outputs and asks GKE (`gcloud container clusters describe`,
with the user's own credentials and a deadline) for the endpoint and CA to trust. The endpoint is
the DNS-based one (`*.gke.goog`, IAM-checked, publicly trusted certificate) when it takes user
traffic, else the IP endpoint (pinned to the CA).
"""

from __future__ import annotations

import base64
import binascii
import json
import shutil
from dataclasses import dataclass
from typing import Any

from verl_gke.commands import run_tool

GCLOUD_TIMEOUT_S = 60.0


class GkeLookupError(Exception):
    """GKE could not be asked, or did not answer as expected; the message is one line."""


@dataclass(frozen=True)
class ClusterFacts:
    endpoint: str
    ca_certificate: str
    """base64 PEM, as GKE's masterAuth.clusterCaCertificate."""


def describe(name: str, location: str, *, timeout_s: float = GCLOUD_TIMEOUT_S) -> ClusterFacts:
    """Endpoint and CA of cluster `name` in `location`, from GKE (gcloud's configured project)."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise GkeLookupError("gcloud not found on PATH: it is needed to read the cluster's endpoint and CA from GKE "
                             "(install the Google Cloud CLI, or pass --dashboard-url URL)")
    command = [gcloud, "container", "clusters", "describe", name, "--location", location, "--format", "json"]
    shown = f"gcloud container clusters describe {name} --location {location}"
    stdout = run_tool(command, shown, timeout_s, GkeLookupError)
    try:
        cluster = json.loads(stdout)
        endpoint = _reachable_endpoint(cluster)
        ca = cluster["masterAuth"]["clusterCaCertificate"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise GkeLookupError(f"`{shown}` did not answer a cluster with endpoint (or "
                             "controlPlaneEndpointsConfig.dnsEndpointConfig.endpoint) and masterAuth.clusterCaCertificate") \
            from None
    if not isinstance(endpoint, str) or not endpoint or not _is_pem(ca):
        raise GkeLookupError(f"`{shown}` answered an empty endpoint or a CA that is not a base64 PEM certificate")
    return ClusterFacts(endpoint=endpoint, ca_certificate=ca)


def _reachable_endpoint(cluster: dict[str, Any]) -> Any:
    """The DNS-based endpoint when it takes user traffic or the IP endpoint is off, else the IP
    `endpoint`: gcloud's own choice for `get-credentials --dns-endpoint`
    (googlecloudsdk/api_lib/container/util.py, _GetClusterEndpoint)."""
    config = cluster.get("controlPlaneEndpointsConfig") or {}
    dns = config.get("dnsEndpointConfig") or {}
    ip_enabled = (config.get("ipEndpointsConfig") or {}).get("enabled", True)
    if dns.get("allowExternalTraffic") or ip_enabled is False:
        return dns.get("endpoint")
    return cluster["endpoint"]


def _is_pem(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return base64.b64decode(value, validate=True).lstrip().startswith(b"-----BEGIN CERTIFICATE-----")
    except (binascii.Error, ValueError):
        return False

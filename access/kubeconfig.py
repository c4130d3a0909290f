"""A kubeconfig for a GKE cluster that holds no credential of its own."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import yaml

AUTH_PLUGIN = "gke-gcloud-auth-plugin"
AUTH_PLUGIN_INSTALL_HINT = (
    "Install gke-gcloud-auth-plugin for use with kubectl by following "
    "https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl#install_plugin"
)


def is_dns_endpoint(endpoint: str) -> bool:
    """True when `endpoint` (with or without https://) is a host name, i.e. GKE's DNS-based endpoint
    (`gke-<id>-<project number>.<region>.gke.goog`), not the IP endpoint."""
    host = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}").hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def gke_kubeconfig(cluster_name: str, endpoint: str, ca_certificate: str | None) -> str:
    """Kubeconfig YAML for one GKE cluster.

    `endpoint` is the cluster's DNS-based endpoint or its IP `endpoint` (with or without https://).
    The IP endpoint presents a certificate of the cluster's own CA, so `ca_certificate` (base64
    `master_auth.cluster_ca_certificate`) is required and pinned. The DNS endpoint presents a
    publicly trusted certificate, not one of the cluster CA: the kubeconfig then carries no CA and
    clients verify against the system roots, as `gcloud container clusters get-credentials
    --dns-endpoint` writes it (googlecloudsdk/api_lib/container/kubeconfig.py, Cluster()). The user
    fetches a token at use time through the `gke-gcloud-auth-plugin` exec plugin, so the file holds
    no secret.
    """
    dns = isinstance(endpoint, str) and bool(endpoint.strip()) and is_dns_endpoint(endpoint)
    required = (("cluster_name", cluster_name), ("endpoint", endpoint))
    for key, value in required if dns else (*required, ("ca_certificate", ca_certificate)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"gke_kubeconfig: {key} must be a non-empty string, got {value!r}")
    server = endpoint if endpoint.startswith("https://") else f"https://{endpoint}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": cluster_name,
            "cluster": {"server": server} if dns else {"server": server, "certificate-authority-data": ca_certificate},
        }],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [{
            "name": cluster_name,
            "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": AUTH_PLUGIN,
                "installHint": AUTH_PLUGIN_INSTALL_HINT,
                "provideClusterInfo": True,
            }},
        }],
    }
    text: str = yaml.safe_dump(config, sort_keys=False)
    return text

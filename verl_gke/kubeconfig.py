"""A kubeconfig for a GKE cluster that holds no credential of its own."""

from __future__ import annotations

import yaml

AUTH_PLUGIN = "gke-gcloud-auth-plugin"
AUTH_PLUGIN_INSTALL_HINT = (
    "Install gke-gcloud-auth-plugin for use with kubectl by following "
    "https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl#install_plugin"
)


def gke_kubeconfig(cluster_name: str, endpoint: str, ca_certificate: str) -> str:
    """Kubeconfig YAML for one GKE cluster.

    `endpoint` is the cluster's `endpoint` (an IP or host, with or without https://) and
    `ca_certificate` its base64 `master_auth.cluster_ca_certificate`. The user fetches a token at
    use time through the `gke-gcloud-auth-plugin` exec plugin, so the file holds no secret.
    """
    for key, value in (("cluster_name", cluster_name), ("endpoint", endpoint),
                       ("ca_certificate", ca_certificate)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"gke_kubeconfig: {key} must be a non-empty string, got {value!r}")
    server = endpoint if endpoint.startswith("https://") else f"https://{endpoint}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": cluster_name,
            "cluster": {"server": server, "certificate-authority-data": ca_certificate},
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

"""Helm values of the namespace-scoped KubeRay operator (tutorial-ja, A4X:
`helm upgrade --install kuberay-operator ... singleNamespaceInstall=true watchNamespace={NS}`).

Only where GKE's Ray operator add-on is off: both install the same ray.io CRDs.
"""

from __future__ import annotations

from typing import Any

from manifests.helm import HelmChart

# The chart release that ships the v1.6.2 ray.io CRDs the manifests are validated against.
CHART = HelmChart(name="kuberay-operator", repo="https://ray-project.github.io/kuberay-helm/", version="1.6.2",
                  image="quay.io/kuberay/operator:v1.6.2",
                  url="https://github.com/ray-project/kuberay-helm/releases/download/kuberay-operator-1.6.2/"
                      "kuberay-operator-1.6.2.tgz")


def helm_values(*, namespace: str, image: Any) -> dict[str, Any]:
    """Namespaced RBAC only, watching just the namespace the Ray cluster runs in; the operator's image
    by digest (`image`: helm.image_values of `name:tag@sha256:...`; the chart's template writes
    `image: <repository>:<tag>`)."""
    if not namespace:
        raise ValueError("namespace = '': the KubeRay operator needs the namespace it watches")
    return {"singleNamespaceInstall": True, "watchNamespace": [namespace], "image": image}

"""The schema checks themselves: each accepts a valid object and names every error of a bad one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests import k8s_schema
from tests.k8s_schema import validate_core, validate_custom


def _ray_cluster() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc"},
        "spec": {
            "rayVersion": "2.47.0",
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "img:1"}]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu-group",
                    "replicas": 2,
                    "minReplicas": 2,
                    "maxReplicas": 2,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "nodeSelector": {"cloud.google.com/gke-accelerator-count": "8"},
                            "containers": [{"name": "ray-worker", "image": "img:1"}],
                        }
                    },
                }
            ],
        },
    }


def _compute_domain() -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "cd", "namespace": "ns"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "ch"}}},
    }


def test_valid_custom_resources_pass() -> None:
    validate_custom(_ray_cluster())
    validate_custom(_compute_domain())


def test_custom_resource_errors_are_all_listed_with_their_paths() -> None:
    bad = _ray_cluster()
    worker = bad["spec"]["workerGroupSpecs"][0]
    # The tutorial's bug 3: an integer node selector value.
    worker["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-accelerator-count"] = 8
    worker["replicaz"] = 2
    with pytest.raises(AssertionError) as err:
        validate_custom(bad)
    text = str(err.value)
    assert "2 schema error(s)" in text
    assert "spec.workerGroupSpecs[0].template.spec.nodeSelector.cloud.google.com/gke-accelerator-count" in text
    assert "8 is not of type 'string'" in text
    assert "'replicaz' was unexpected" in text


def test_whole_number_floats_count_as_integers_as_the_engine_sends_them() -> None:
    engine = _compute_domain()
    engine["spec"]["numNodes"] = 2.0
    validate_custom(engine)
    engine["spec"]["numNodes"] = 2.5
    with pytest.raises(AssertionError, match="2.5 is not of type 'integer'"):
        validate_custom(engine)


def test_compute_domain_requires_num_nodes() -> None:
    bad = _compute_domain()
    del bad["spec"]["numNodes"]
    with pytest.raises(AssertionError, match="'numNodes' is a required property"):
        validate_custom(bad)


def test_unserved_version_and_unknown_kind_are_rejected() -> None:
    old = _ray_cluster()
    old["apiVersion"] = "ray.io/v1alpha2"
    with pytest.raises(AssertionError, match="not a served version of RayCluster; served: v1"):
        validate_custom(old)
    other = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(AssertionError, match="no CRD for kind Widget in group example.com"):
        validate_custom(other)


def test_shared_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(k8s_schema.SHARED_DIR_ENV, str(tmp_path))
    with pytest.raises(AssertionError, match=f"set {k8s_schema.SHARED_DIR_ENV}"):
        k8s_schema.shared_dir()
    (tmp_path / "crds").mkdir()
    assert k8s_schema.shared_dir() == tmp_path


def _pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"nodeSelector": {"a": "8"}, "containers": [{"name": "c", "image": "img:1"}]},
    }


def test_valid_core_object_passes() -> None:
    validate_core(_pod())
    validate_core({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}, "1.32")


def test_core_object_error_names_its_path() -> None:
    bad = copy.deepcopy(_pod())
    bad["spec"]["nodeSelector"]["a"] = 8
    with pytest.raises(AssertionError, match=r"v1 Pod/p is invalid for Kubernetes 1.34: spec.nodeSelector.a: 8 is not of type 'string'"):
        validate_core(bad)


def test_core_strict_rejects_unknown_fields_and_kinds() -> None:
    bad = _pod()
    bad["spec"]["nodeSelectr"] = {}
    with pytest.raises(AssertionError, match="nodeSelectr"):
        validate_core(bad)
    with pytest.raises(AssertionError, match="Couldn't find schema for kind Widget"):
        validate_core({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w"}})

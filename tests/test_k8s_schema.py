"""The schema checks themselves: each accepts a valid object and names every error of a bad one."""

from __future__ import annotations

import copy
import dataclasses
import functools
import http.server
import re
import shutil
import threading
from collections.abc import Iterator
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


@pytest.fixture
def crd_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A loopback HTTP server standing in for raw.githubusercontent.com (no internet here), serving
    the pinned files; yields (served folder, empty cache folder)."""
    served = tmp_path / "served"
    served.mkdir()
    for path in k8s_schema.crd_paths():
        shutil.copy(path, served)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    files = tuple(dataclasses.replace(c, url=f"{base}/{c.name}") for c in k8s_schema.CRD_FILES)
    monkeypatch.setattr(k8s_schema, "CRD_FILES", files)
    monkeypatch.setattr(k8s_schema, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.delenv(k8s_schema.CRD_DIR_ENV, raising=False)
    yield served, tmp_path / "cache"
    server.shutdown()
    server.server_close()


def test_crds_are_downloaded_checked_and_cached(crd_server: tuple[Path, Path]) -> None:
    served, cache = crd_server
    paths = k8s_schema.crd_paths()
    assert [p.name for p in paths] == [c.name for c in k8s_schema.CRD_FILES]
    assert all(p.parent == cache for p in paths)
    shutil.rmtree(served)  # a second call reads the cache, not the network
    assert k8s_schema.crd_paths() == paths


def test_a_download_with_another_sha256_is_refused_and_not_cached(crd_server: tuple[Path, Path]) -> None:
    served, cache = crd_server
    first = k8s_schema.CRD_FILES[0]
    (served / first.name).write_text("apiVersion: v1\n")
    with pytest.raises(AssertionError, match=rf"{re.escape(first.url)}: sha256 \w+, expected {first.sha256}"):
        k8s_schema.crd_paths()
    assert not (cache / first.name).exists()


def test_without_network_or_crd_dir_one_message_names_the_variable_and_urls(
        crd_server: tuple[Path, Path]) -> None:
    served, _ = crd_server
    shutil.rmtree(served)
    with pytest.raises(AssertionError) as error:
        k8s_schema.crd_paths()
    message = str(error.value)
    assert f"Set {k8s_schema.CRD_DIR_ENV} to a folder holding" in message
    assert all(message.count(c.url) == 2 for c in k8s_schema.CRD_FILES)  # the failure and the list


def test_crd_dir_files_are_checked_against_their_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in k8s_schema.crd_paths():
        shutil.copy(path, tmp_path)
    last = k8s_schema.CRD_FILES[-1]
    (tmp_path / last.name).write_text("kind: Other\n")
    (tmp_path / k8s_schema.CRD_FILES[0].name).unlink()
    monkeypatch.setenv(k8s_schema.CRD_DIR_ENV, str(tmp_path))
    with pytest.raises(AssertionError) as error:
        k8s_schema.crd_paths()
    assert f"{tmp_path / k8s_schema.CRD_FILES[0].name}: missing" in str(error.value)
    assert f"{tmp_path / last.name}: sha256 differs from the pinned {last.sha256}" in str(error.value)


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

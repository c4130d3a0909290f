"""The deploy's critical path, modeled from each stack's synth graph (resources.json)."""

from __future__ import annotations

from typing import Any

import pytest

from domain import deploy_timing
from domain.platforms import DEPLOY_DURATIONS, GPU_POOL_CREATE, KUBE_WRITE
from domain.config import load_config
from domain.stack_files import raw_config
from tests.conftest import STACKS
from verl_gke import synth

# Modeled minutes to the first training step, per stack (the durations of domain.platforms).
MODELED_MIN = {"a4": 26.2, "a4-standard": 26.2, "a3u-standard": 26.2, "a4x": 26.0, "smoke": 23.9}


def resources(result: Any) -> list[dict[str, Any]]:
    return [r.__dict__ for r in result.registrations]


def staging(stack: str) -> Any:
    """The staging Job's time for the stack's model, as synth models it."""
    return synth.staging_time(load_config(raw_config(stack)[0]).model)


def names_on_path(model: deploy_timing.DeployModel) -> list[str]:
    return [s.name for s in model.path]


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_is_within_ten_percent_of_gkes_floor(synth_stack: Any, stack: str) -> None:
    model = deploy_timing.model(resources(synth_stack(stack)), staging(stack))
    assert model.unknown_types == ()
    assert round(model.total_s / 60, 1) == MODELED_MIN[stack]
    assert model.total_s <= model.floor_s * (1 + deploy_timing.FLOOR_SLACK)
    path = names_on_path(model)
    assert path[-1] == "grpo" and "gke-cluster" in path and "ray-ray-cluster" in path


def test_on_a4x_the_operator_and_the_dra_driver_install_while_the_gpu_pool_is_created(synth_stack: Any) -> None:
    graph = resources(synth_stack("a4x"))
    by_urn = {r["urn"]: r for r in graph}
    gpu_pool = next(r["urn"] for r in graph if r["name"] == "gpu-pool")
    waits_for_pool = {r["name"] for r in graph if gpu_pool in r["dependencies"]}
    # Only what needs GPU nodes: the RayCluster (its pods) and the network mapping (the NCCL
    # installer's rollout on them).
    assert {"ray-kuberay-operator", "dra-driver", "dra-compute-domain", "dra-namespace", "dra-quota",
            "dra-rdma-nic"}.isdisjoint(waits_for_pool)
    assert "ray-ray-cluster" in waits_for_pool
    model = deploy_timing.model(graph)
    assert not {"dra-driver", "ray-kuberay-operator"} & set(names_on_path(model))
    ray = next(s for s in model.path if s.name == "ray-ray-cluster")
    driver = next(r for r in graph if r["name"] == "dra-driver")
    assert by_urn[driver["urn"]]["type"] == "kubernetes:helm.sh/v3:Release"
    # APIs, the stack's VPC and its subnet, cluster, placement policy, GPU pool, NCCL installer (the NAT
    # is off the path: only what pulls from outside Google waits for it).
    assert ray.start_s == 60 + 30 + 20 + 540 + 10 + 600 + 120


def _r(name: str, kind: str, deps: tuple[str, ...] | list[str] = (), custom: bool = True,
       parent: str | None = None, **inputs: Any) -> dict[str, Any]:
    return {"urn": f"urn:{name}", "type": kind, "name": name, "custom": custom, "parent": parent,
            "provider": None, "dependencies": [f"urn:{d}" for d in deps], "inputs": inputs}


def _ray(deps: list[str], image: str) -> dict[str, Any]:
    group = {"template": {"spec": {"containers": [{"image": image}]}}}
    return _r("ray", deploy_timing.RAY_CLUSTER, deps, spec={"workerGroupSpecs": [group]})


def test_the_longest_chain_is_the_critical_path_and_parallel_work_is_free() -> None:
    graph = [
        _r("cluster", deploy_timing.CLUSTER),
        _r("gpu-pool", deploy_timing.NODE_POOL, ["cluster"]),
        _r("helm", "kubernetes:helm.sh/v3:Release", ["cluster"]),  # 2 min beside the pool's 10
        _r("cm", "kubernetes:core/v1:ConfigMap", ["cluster"]),
        _ray(["gpu-pool", "helm", "cm"], "verlai/verl:vllm011.dev7"),
        _r("grpo", deploy_timing.GRPO_JOB, ["ray"]),
    ]
    model = deploy_timing.model(graph)
    assert names_on_path(model) == ["cluster", "gpu-pool", "ray", "grpo"]
    assert model.total_s == 540 + GPU_POOL_CREATE.seconds + 300 + 90 == model.floor_s
    # The operator after the pool instead: on the path, 2 minutes over the floor.
    graph[2] = _r("helm", "kubernetes:helm.sh/v3:Release", ["gpu-pool"])
    later = deploy_timing.model(graph)
    assert names_on_path(later) == ["cluster", "gpu-pool", "helm", "ray", "grpo"]
    assert later.total_s - later.floor_s == DEPLOY_DURATIONS["kubernetes:helm.sh/v3:Release"].seconds


def test_an_image_from_artifact_registry_is_streamed() -> None:
    docker_hub = deploy_timing.duration(_ray([], "verlai/verl@sha256:" + "0" * 64), has_gpu_pool=True)
    streamed = deploy_timing.duration(
        _ray([], "us-central1-docker.pkg.dev/p/verl-images/verlai/verl@sha256:" + "0" * 64), has_gpu_pool=True)
    assert (docker_hub.seconds, streamed.seconds) == (300, 90)
    # Autopilot: GKE makes the GPU nodes once the pods wait for them.
    assert deploy_timing.duration(_ray([], "verlai/verl:x"), has_gpu_pool=False).seconds == 900


def test_an_image_not_known_yet_is_streamed_when_the_ray_cluster_waits_for_the_mirror() -> None:
    """A first preview knows no digest pinned at `pulumi up`: the whole image is unknown then."""
    repository = f"urn:pulumi:a4::verl-gke::verl-gke:index:ImageMirror${deploy_timing.AR_REPOSITORY}::images-repository"
    mirrored = _ray([], deploy_timing.UNKNOWN)
    mirrored["dependencies"] = [repository]
    assert deploy_timing.duration(mirrored, has_gpu_pool=True).seconds == 90
    assert deploy_timing.duration(_ray(["gpu-pool"], deploy_timing.UNKNOWN), has_gpu_pool=True).seconds == 300


@pytest.mark.parametrize("stack", STACKS)
def test_a_first_preview_models_the_same_time(stack: str) -> None:
    preview = deploy_timing.model(resources(synth.run(stack, preview=True)), staging(stack))
    assert round(preview.total_s / 60, 1) == MODELED_MIN[stack]


def test_a_config_file_is_waited_for_with_its_siblings_and_unknown_kinds_are_named() -> None:
    graph = [
        _r("mapping", "verl-gke:index:NetworkMapping", custom=False),
        _r("installer", deploy_timing.CONFIG_FILE, custom=False, parent="urn:mapping"),
        _r("net", "kubernetes:networking.gke.io/v1:Network", parent="urn:mapping"),
        _r("ray", "kubernetes:core/v1:Pod", ["net"]),
        _r("thing", "gcp:foo/bar:Baz"),
    ]
    model = deploy_timing.model(graph)
    assert names_on_path(model) == ["installer", "ray"]
    assert model.total_s == DEPLOY_DURATIONS[deploy_timing.CONFIG_FILE].seconds + KUBE_WRITE.seconds
    assert model.unknown_types == ("gcp:foo/bar:Baz",)


def test_every_duration_names_its_source() -> None:
    assert all(d.source and d.seconds >= 0 for d in DEPLOY_DURATIONS.values())


def test_synth_prints_the_modeled_time_to_first_step(synth_stack: Any) -> None:
    from pathlib import Path

    from verl_gke import synth

    lines = synth.summary(synth_stack("a4x"), Path("dist/a4x")).splitlines()
    # The deploy to the job RUNNING, then verl's own start-up: the model read twice (actor and reference),
    # vLLM, the first sync and the validation before training A4X runs.
    assert ("Time to first training step (modeled): 31.3 min; the job RUNNING at 26.0 min; GKE's floor (cluster + "
            "GPU nodes + RDMA set-up + job start) 24.0 min (+8%); then verl start-up 5.3 min: processes 60 s + the "
            "model (65.5 GB bf16, read 2x) through GCS FUSE at 1 GB/s + vLLM start and CUDA graphs 90 s + first "
            "weight sync 30 s + validation before training 7 s") in lines
    assert ("From `pulumi up` to released GPUs (modeled): 98 min, cost unknown (no price): first step 31.3 + run "
            "49.9 + export 5.4 + release 11.0 min") in lines


def test_the_smoke_stack_is_under_45_minutes_and_5_dollars_to_released_gpus(synth_stack: Any) -> None:
    from pathlib import Path

    lines = synth.summary(synth_stack("smoke"), Path("dist/smoke")).splitlines()
    [line] = [line for line in lines if line.startswith("From `pulumi up` to released GPUs (modeled): ")]
    assert line == ("From `pulumi up` to released GPUs (modeled): 41 min, ~$1.83 at $2.67/h (every node for the "
                    "whole time: an upper bound): first step 26.9 + run 2.2 + export 1.1 + release 11.0 min")
    assert ("The smoke stack cannot exercise: RDMA (NCCL runs over TCP), DRA/IMEX and ComputeDomains (A4X), arm64 "
            "images (A4X).") in lines


def test_staging_takes_the_time_of_the_stacks_model() -> None:
    # 600 s for Qwen2.5-32B's 65.5 GB: 60 s + 65.5 GB at 121 MB/s; the smoke stack's 0.99 GB: 60 + 8 s.
    assert synth.staging_time("Qwen/Qwen2.5-32B-Instruct").seconds == pytest.approx(600.0, abs=1)
    assert synth.staging_time("Qwen/Qwen2.5-0.5B-Instruct").seconds == pytest.approx(60 + 0.988 / 0.1213, abs=0.1)
    assert synth.staging_time("someone/other-model") is None  # not in the model table: the 32B estimate


def test_gpu_pools_of_several_capacity_kinds_count_once_in_the_floor(synth_stack: Any) -> None:
    model = deploy_timing.model(resources(synth_stack("smoke")), staging("smoke"))
    # Spot and on-demand pools are created side by side: cluster 9 + one pool 10 + Ray pods 1.5 + job 1.5.
    assert model.floor_s == 540 + GPU_POOL_CREATE.seconds + 90 + 90
    assert "gpu-on-demand-pool" in names_on_path(model) or "gpu-spot-pool" in names_on_path(model)


def test_without_the_mirror_or_image_streaming_the_image_is_pulled_whole() -> None:
    from verl_gke import synth

    for override in ({"verl-gke:imageMirror": "false"}, {"verl-gke:imageStreaming": "false"}):
        model = deploy_timing.model(resources(synth.run("a4-standard", overrides=override)))
        ray = next(s for s in model.path if s.name == "ray-ray-cluster")
        assert ray.duration.seconds == 300, override

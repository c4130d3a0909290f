"""verl-gke:capacity through GKE's own mechanisms: node pool settings per kind on Standard, a custom
ComputeClass that orders several kinds (and reservations or flex-start on Autopilot)."""

from __future__ import annotations

import pytest

from tests.k8s_schema import validate_custom
from verl_gke import synth

NODE_POOL = "gcp:container/nodePool:NodePool"


def _pools(result: synth.SynthResult) -> dict[str, dict]:
    return {r.inputs["name"]: r.inputs for r in result.registrations if r.type == NODE_POOL
            and r.inputs["name"] != "verl-cpu"}


def _manifest(result: synth.SynthResult, kind: str) -> list[dict]:
    return [obj for obj in result.manifests() if obj["kind"] == kind]


def _workers(result: synth.SynthResult) -> dict:
    [cluster] = _manifest(result, "RayCluster")
    return cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]


def test_flex_start_alone_is_one_pool_that_starts_empty_and_scales_from_zero():
    result = synth.run("a4-standard", overrides={"verl-gke:capacity": '["flex-start"]', "verl-gke:reservation": ""})
    pool = _pools(result)["gpu-pool"]
    assert pool["nodeConfig"]["flexStart"] is True
    assert pool["nodeConfig"]["spot"] is False
    assert pool["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert pool["initialNodeCount"] == 0
    assert pool["autoscaling"] == {"totalMinNodeCount": 0, "totalMaxNodeCount": 10, "locationPolicy": "ANY"}
    assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}
    assert _manifest(result, "ComputeClass") == []
    # Flex-start nodes last seven days at most: so does the run's budget.
    [job] = [r for r in result.registrations if r.type == synth.GRPO_JOB_TYPE]
    assert job.inputs["budget_s"] == 7 * 24 * 3600


def test_several_kinds_on_standard_are_a_pool_each_ordered_by_a_compute_class():
    result = synth.run("a4-standard", overrides={"verl-gke:capacity": '["reservation","flex-start","spot"]'})
    pools = _pools(result)
    assert sorted(pools) == ["gpu-flex-start", "gpu-reservation", "gpu-spot"]
    assert pools["gpu-reservation"]["nodeConfig"]["reservationAffinity"]["consumeReservationType"] == \
        "SPECIFIC_RESERVATION"
    assert pools["gpu-spot"]["nodeConfig"]["spot"] is True
    for name, pool in pools.items():
        assert pool["nodeConfig"]["labels"] == {"cloud.google.com/compute-class": "verl-gpu"}, name
        assert {"key": "cloud.google.com/compute-class", "value": "verl-gpu", "effect": "NO_SCHEDULE"} in \
            pool["nodeConfig"]["taints"], name
    [klass] = _manifest(result, "ComputeClass")
    validate_custom(klass)
    assert klass["spec"]["priorities"] == [{"nodepools": ["gpu-reservation"]}, {"nodepools": ["gpu-flex-start"]},
                                           {"nodepools": ["gpu-spot"]}]
    workers = _workers(result)
    assert workers["nodeSelector"]["cloud.google.com/compute-class"] == "verl-gpu"
    assert {"key": "cloud.google.com/compute-class", "operator": "Equal", "value": "verl-gpu",
            "effect": "NoSchedule"} in workers["tolerations"]


def test_autopilot_reservation_then_spot_through_a_compute_class():
    result = synth.run("a4", overrides={"verl-gke:capacity": '["reservation","spot"]',
                                        "verl-gke:reservation": "b200-res", "verl-gke:gpuSpot": "false"})
    [klass] = _manifest(result, "ComputeClass")
    validate_custom(klass)
    node = {"machineType": "a4-highgpu-8g", "gpu": {"type": "nvidia-b200", "count": 8}}
    assert klass["spec"]["priorities"] == [
        {**node, "reservations": {"affinity": "Specific",
                                  "specific": [{"name": "b200-res", "project": "replace-me-project"}]}},
        {**node, "spot": True},
    ]
    selector = _workers(result)["nodeSelector"]
    assert selector["cloud.google.com/compute-class"] == "verl-gpu"
    assert "cloud.google.com/gke-spot" not in selector


@pytest.mark.parametrize("stack", ["a4", "a4-standard"])
def test_one_kind_keeps_the_stacks_as_they_were(stack: str, synth_stack):
    result = synth_stack(stack)
    assert _manifest(result, "ComputeClass") == []
    assert "verl-gpu" not in str(_workers(result))


def _quota(value: str, family: str = "NVIDIA_B200", region: str = "us-central1") -> dict:
    return {"quotaId": "GPUS-PER-GPU-FAMILY-per-project-region", "dimensionsInfos": [
        {"dimensions": {}, "details": [{"value": "0"}], "applicableLocations": ["global"]},
        {"dimensions": {"gpu_family": family, "region": region}, "details": [{"value": value}],
         "applicableLocations": [region]}]}


def test_on_demand_checks_the_gpu_quota_of_the_family_in_the_region():
    from domain import preflight
    from domain.config import load_config
    from tests.conftest import BASE_CONFIG

    cfg = load_config({**BASE_CONFIG, "verl-gke:capacity": '["on-demand"]', "verl-gke:reservation": ""})
    assert preflight.gpu_quota(cfg, _quota("16")) == 16
    assert preflight.quota_problems(cfg, _quota("16")) == []
    assert preflight.quota_problems(cfg, _quota("8")) == [
        "verl-gke:gpuNodes = 2: 16 NVIDIA_B200 GPUs on demand, but the project's "
        "GPUS-PER-GPU-FAMILY-per-project-region quota in us-central1 is 8; request more quota or lower gpuNodes."]
    # Another family's or region's grant is not ours: the default (0) applies.
    assert preflight.gpu_quota(cfg, _quota("64", family="NVIDIA_H100")) == 0
    assert preflight.gpu_quota(cfg, _quota("64", region="europe-west4")) == 0


def test_the_preview_stops_on_too_little_quota_and_spot_asks_the_preemptible_one():
    import pulumi

    from domain import preflight

    on_demand = {"verl-gke:capacity": '["spot","on-demand"]', "verl-gke:reservation": ""}
    with pytest.raises(pulumi.RunError, match="16 NVIDIA_B200 GPUs on demand, but the project's "
                                              "GPUS-PER-GPU-FAMILY-per-project-region quota in us-central1 is 8"):
        synth.run("a4-standard", overrides=on_demand, cloud={preflight.QUOTA: _quota("8")})
    enough = synth.run("a4-standard", overrides=on_demand, cloud={preflight.QUOTA: _quota("16")})
    assert preflight.QUOTA not in enough.unchecked
    assert "preflight: GPU quota in us-central1: 16 NVIDIA_B200" in enough.log
    spot = synth.run("a4-standard", overrides={"verl-gke:capacity": '["spot"]', "verl-gke:reservation": ""})
    assert preflight.QUOTA in spot.unchecked  # asked, answered by the healthy stand-in: no figure shown
    assert not any("GPU quota" in line for line in spot.log)


def _preemptible_quota(value: str) -> dict:
    return {**_quota(value), "quotaId": "PREEMPTIBLE-GPUS-PER-GPU-FAMILY-per-project-region"}


@pytest.mark.parametrize("kinds", ['["spot"]', '["flex-start"]', '["flex-start","spot"]'])
def test_spot_and_flex_start_check_the_preemptible_gpu_quota(kinds):
    from domain import preflight
    from domain.config import load_config
    from tests.conftest import BASE_CONFIG

    cfg = load_config({**BASE_CONFIG, "verl-gke:capacity": kinds, "verl-gke:reservation": ""})
    quota_id = preflight.PREEMPTIBLE_GPU_QUOTA_ID
    assert preflight.quota_problems(cfg, _preemptible_quota("16"), quota_id) == []
    named = " or ".join(k for k in cfg.capacity_kinds)
    assert preflight.quota_problems(cfg, _preemptible_quota("8"), quota_id) == [
        f"verl-gke:gpuNodes = 2: 16 NVIDIA_B200 GPUs on {named}, but the project's "
        "PREEMPTIBLE-GPUS-PER-GPU-FAMILY-per-project-region quota in us-central1 is 8; "
        "request more quota or lower gpuNodes."]


def test_the_preview_stops_on_too_little_preemptible_quota_with_enough_on_demand():
    import pulumi

    from domain import preflight

    answers = [_preemptible_quota("8"), _quota("16")]  # each picked by the call's quotaId
    both = {"verl-gke:capacity": '["flex-start","spot","on-demand"]', "verl-gke:reservation": ""}
    with pytest.raises(pulumi.RunError, match="16 NVIDIA_B200 GPUs on flex-start or spot, but the project's "
                                              "PREEMPTIBLE-GPUS-PER-GPU-FAMILY-per-project-region quota") as error:
        synth.run("a4-standard", overrides=both, cloud={preflight.QUOTA: answers})
    assert "GPUs on demand" not in str(error.value)
    enough = synth.run("a4-standard", overrides=both,
                       cloud={preflight.QUOTA: [_preemptible_quota("16"), _quota("16")]})
    assert "preflight: GPU quota in us-central1: 16 NVIDIA_B200" in enough.log
    assert "preflight: preemptible GPU quota in us-central1: 16 NVIDIA_B200" in enough.log


def test_an_unreadable_quota_is_a_note_not_a_stop():
    from domain import preflight

    result = synth.run("a4-standard", overrides={"verl-gke:capacity": '["on-demand"]', "verl-gke:reservation": ""},
                       cloud={preflight.QUOTA: {"error": "cloudquotas.googleapis.com SERVICE_DISABLED"}})
    assert any(line.startswith("preflight: GPU quota not checked:") and "SERVICE_DISABLED" in line
               for line in result.log)


def test_a_reservation_pools_own_nodes_count_as_free_under_either_name():
    from domain import preflight

    answer = {"nodePools": [{"name": "gpu-reservation", "nodeCount": 2}, {"name": "gpu-spot", "nodeCount": 3},
                            {"name": "gpu-pool", "nodeCount": 1}]}
    assert preflight.own_gpu_nodes(answer) == 3


def _l4_quota(value: str, preemptible: bool) -> dict:
    """Compute Engine's per-model L4 quotas (NVIDIA_L4_GPUS, PREEMPTIBLE_NVIDIA_L4_GPUS): no gpu_family dimension."""
    return {"quotaId": f"{'PREEMPTIBLE-' if preemptible else ''}NVIDIA-L4-GPUS-per-project-region",
            "dimensionsInfos": [{"dimensions": {"region": "us-central1"}, "details": [{"value": value}],
                                 "applicableLocations": ["us-central1"]}]}


def test_the_smoke_stack_checks_the_l4_quotas_spot_first_then_on_demand():
    import pulumi

    from domain import preflight

    with pytest.raises(pulumi.RunError, match="2 NVIDIA_L4 GPUs on spot, but the project's "
                                              "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region quota in us-central1 "
                                              "is 1; request more quota or lower gpuNodes"):
        synth.run("smoke", cloud={preflight.QUOTA: [_l4_quota("1", True), _l4_quota("2", False)]})
    with pytest.raises(pulumi.RunError, match="2 NVIDIA_L4 GPUs on demand, but the project's "
                                              "NVIDIA-L4-GPUS-per-project-region quota in us-central1 is 0"):
        synth.run("smoke", cloud={preflight.QUOTA: [_l4_quota("2", True), _l4_quota("0", False)]})
    enough = synth.run("smoke", cloud={preflight.QUOTA: [_l4_quota("4", True), _l4_quota("2", False)]})
    assert "preflight: preemptible GPU quota in us-central1: 4 NVIDIA_L4" in enough.log
    assert "preflight: GPU quota in us-central1: 2 NVIDIA_L4" in enough.log

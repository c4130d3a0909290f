"""The fabric check end to end on real Ray processes: a head of the module's own and two nodes
joined with `ray start --address`, each with 2 logical GPUs. The check runs as a Ray job with
`--backend gloo` (torch's CPU backend): the same placement, actors, process group and all-reduce
as with NCCL on GPUs; only the figure itself needs GPUs to mean anything."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider
from tests.ray_head import RayHead, start_node, stop_node
from verl_gke import fabric
from workloads.fabric_check import bus_bandwidth_gbps

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def two_gpu_nodes(ray_cluster: RayHead) -> Iterator[RayHead]:
    nodes = [start_node(ray_cluster, cpus=2, gpus=2) for _ in range(2)]
    try:
        yield ray_cluster
    finally:
        for node in nodes:
            stop_node(node)


def gloo_check(**extra) -> fabric.FabricCheck:
    return fabric.FabricCheck(nodes=2, gpus_per_node=2, backend="gloo", python=sys.executable, size_mb=4,
                              iters=3, timeout_s=240, **extra)


def test_bus_bandwidth_is_nccl_tests_formula():
    # 1 GB in 1 s over 8 ranks: algbw 1 GB/s, busbw x 2*7/8.
    assert bus_bandwidth_gbps(10**9, 1.0, 8) == pytest.approx(1.75)
    assert bus_bandwidth_gbps(10**9, 0.5, 1) == pytest.approx(2.0)


def test_the_check_measures_across_every_gpu_of_both_nodes(two_gpu_nodes: RayHead):
    client = JobSubmissionClient(two_gpu_nodes.dashboard_url)
    result = fabric.run_fabric_check(client, gloo_check(), stack="fab")
    assert (result["world"], result["nodes"], result["backend"], result["size_mb"]) == (4, 2, "gloo", 4)
    assert result["busbw_gbps"] > 0
    assert result["submission_id"].startswith("verl-fabric-fab-")
    assert fabric.verdict(result, gloo_check(min_busbw_gbps=0.0001)) is None
    message = fabric.verdict(result, gloo_check(min_busbw_gbps=1e6))
    assert message.startswith(f"fabric check {result['submission_id']}: all-reduce bus bandwidth "
                              f"{result['busbw_gbps']:g} GB/s over 2 nodes x 2 GPUs (gloo), below the 1e+06 GB/s "
                              "floor (verl-gke:fabricMinBusBandwidthGbps)")


def test_a_check_that_cannot_place_its_ranks_is_stopped_at_its_deadline(two_gpu_nodes: RayHead):
    client = JobSubmissionClient(two_gpu_nodes.dashboard_url)
    with pytest.raises(fabric.FabricError) as caught:
        fabric.run_fabric_check(client, fabric.FabricCheck(nodes=3, gpus_per_node=2, backend="gloo",
                                                           python=sys.executable, timeout_s=8), stack="fab")
    assert "after 8 s; it was stopped (3 nodes x 2 GPUs may not be free)" in str(caught.value)


def _props(head: RayHead, **extra) -> dict:
    return {"dashboard_url": head.dashboard_url, "stack": f"t{uuid.uuid4().hex[:8]}", "runtime_env": {},
            "entrypoint": f"{sys.executable} -c 'print(1)'", "startup_grace_s": 0, "expected_workers": 2,
            "expected_gpus": 4, "fabric_check": True, "fabric_backend": "gloo", "fabric_python": sys.executable,
            "ready_timeout_s": 240, "fabric_timeout_s": 240, **extra}


def test_create_measures_the_fabric_then_submits_and_reports_the_figure(two_gpu_nodes: RayHead):
    result = GrpoJobProvider().create(_props(two_gpu_nodes, fabric_min_busbw_gbps=0.0001))
    assert result.outs["fabric_busbw_gbps"] > 0
    assert JobSubmissionClient(two_gpu_nodes.dashboard_url).get_job_info(result.id).entrypoint.endswith("'print(1)'")


def test_create_below_the_floor_fails_and_submits_no_run(two_gpu_nodes: RayHead):
    props = _props(two_gpu_nodes, fabric_min_busbw_gbps=1e6)
    with pytest.raises(fabric.FabricError) as caught:
        GrpoJobProvider().create(props)
    assert "below the 1e+06 GB/s floor" in str(caught.value)
    jobs = JobSubmissionClient(two_gpu_nodes.dashboard_url).list_jobs()
    assert not [j for j in jobs if (j.submission_id or "").startswith(f"verl-grpo-{props['stack']}-")]


def test_verl_gke_fabric_prints_the_figure_and_fails_below_the_floor(two_gpu_nodes: RayHead, tmp_path, capsys):
    from tests.test_cli import outputs_doc, write_outputs
    from verl_gke import cli

    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("verl-grpo-x", gpusPerNode=2))
    base = ["fabric", "--outputs", str(outputs), "--dashboard-url", two_gpu_nodes.dashboard_url, "--backend", "gloo",
            "--python", sys.executable, "--size-mb", "4", "--head-timeout", "60"]
    assert cli.main([*base, "--min-busbw", "0.0001"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bus bandwidth ") and "over 2 nodes x 2 GPUs, gloo, job verl-fabric-a4-" in out
    assert cli.main([*base, "--min-busbw", "1e6"]) == 1
    assert "below the 1e+06 GB/s floor (verl-gke:fabricMinBusBandwidthGbps)" in capsys.readouterr().err

"""The fabric check end to end on real Ray processes: a head of the module's own and two nodes
joined with `ray start --address`, each with 2 logical GPUs. The check runs as a Ray job with
`--backend gloo` (torch's CPU backend): the same placement, actors, process group and all-reduce
as with NCCL on GPUs; only the figure itself needs GPUs to mean anything."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pulumi.dynamic
import pytest
from ray.job_submission import JobSubmissionClient

from components.grpo_job import GrpoJobProvider
from components.job_gates import refuse_a_second_run
from components.job_spec import JobSpec
from tests.ray_head import FlakyLink, RayHead, start_node, stop_node
from access.head_access import job_client
from access import fabric
from workloads.fabric_check import bus_bandwidth_gbps, nccl_transports

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def two_gpu_nodes(ray_cluster: RayHead) -> Iterator[RayHead]:
    nodes = [start_node(ray_cluster, cpus=2, gpus=2) for _ in range(2)]
    try:
        yield ray_cluster
    finally:
        for node in nodes:
            stop_node(node, ray_cluster)  # counted dead before the next module's tests


def gloo_check(**extra) -> fabric.FabricCheck:
    return fabric.FabricCheck(nodes=2, gpus_per_node=2, backend="gloo", python=sys.executable, size_mb=4,
                              iters=3, timeout_s=240, **extra)


def test_bus_bandwidth_is_nccl_tests_formula():
    # 1 GB in 1 s over 8 ranks: algbw 1 GB/s, busbw x 2*7/8.
    assert bus_bandwidth_gbps(10**9, 1.0, 8) == pytest.approx(1.75)
    assert bus_bandwidth_gbps(10**9, 0.5, 1) == pytest.approx(2.0)


@pytest.fixture(scope="module")
def created(two_gpu_nodes: RayHead) -> tuple[pulumi.dynamic.CreateResult, fabric.FabricCheck, dict]:
    """The one real measurement across both nodes, run by the provider's create as `pulumi up` does: its
    result, the check the provider asked for and what the check returned. The verdicts below (the provider's
    and the CLI's refusal under a floor, the CLI's report) judge it, rather than each measuring again."""
    real = fabric.run_fabric_check
    seen: list[tuple[fabric.FabricCheck, dict]] = []

    def measuring(client: JobSubmissionClient, check: fabric.FabricCheck, stack: str) -> dict:
        # At 4 MB x 3, not the provider's 256 MB x 20 (pinned in test_create_measures_...): a 256 MB gloo
        # all-reduce takes a minute of both cores and checks nothing more of the contract.
        seen.append((check, real(client, dataclasses.replace(check, size_mb=4, iters=3), stack)))
        return seen[-1][1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fabric, "run_fabric_check", measuring)
        result = GrpoJobProvider().create(_props(two_gpu_nodes, fabric_min_busbw_gbps=0.0001))
    ((check, measured),) = seen
    return result, check, measured


@pytest.fixture(scope="module")
def measured(created: tuple[pulumi.dynamic.CreateResult, fabric.FabricCheck, dict]) -> dict:
    return created[2]


def test_the_check_measures_across_every_gpu_of_both_nodes(measured: dict):
    result = measured
    assert (result["world"], result["nodes"], result["backend"], result["size_mb"]) == (4, 2, "gloo", 4)
    assert result["busbw_gbps"] > 0
    assert fabric.verdict(result, gloo_check(min_busbw_gbps=0.0001)) is None
    # The transport gate reads the job's real log: gloo prints no NCCL line, so a check that expects
    # RDMA fails naming what it saw (the transport is judged only where NCCL runs).
    assert result["transports"] == {}
    expecting = fabric.FabricCheck(nodes=2, gpus_per_node=2, backend="nccl", transports=("NET/gIB", "NET/IB"))
    assert fabric.verdict(result, expecting) == (
        f"fabric check {result['submission_id']}: NCCL never connected GPUs via NET/gIB or NET/IB (seen: no "
        "`NCCL INFO Channel ... via` line); training would not use the platform's fabric. Check the NCCL lines of "
        "the job's log, or turn verl-gke:fabricCheck off to train anyway.")
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


def _check_in_the_background(link: FlakyLink, stack: str) -> tuple[threading.Thread, list[BaseException], str]:
    """A check that cannot place its ranks (it runs until stopped), polled through `link`; returns
    once the head lists it, with its thread, where its error lands and its submission id."""
    client = job_client(f"http://127.0.0.1:{link.port}", "the test head")
    errors: list[BaseException] = []
    check = fabric.FabricCheck(nodes=3, gpus_per_node=2, backend="gloo", python=sys.executable, timeout_s=240)

    def run() -> None:
        try:
            fabric.run_fabric_check(client, check, stack=stack)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (ids := [j.submission_id for j in client.list_jobs() if fabric.is_check_of(j.submission_id or "", stack)]):
        assert time.monotonic() < deadline, "the fabric check was never submitted"
        time.sleep(0.2)
    return thread, errors, ids[0]


def _status(head: RayHead, submission_id: str) -> str:
    return str(JobSubmissionClient(head.dashboard_url).get_job_status(submission_id).value)


def _await_status(head: RayHead, submission_id: str, wanted: str) -> None:
    deadline = time.monotonic() + 60
    while (status := _status(head, submission_id)) != wanted:
        assert time.monotonic() < deadline, f"{submission_id} still {status}, not {wanted}"
        time.sleep(0.5)


def test_a_check_whose_status_poll_fails_is_stopped(two_gpu_nodes: RayHead):
    link = FlakyLink(int(two_gpu_nodes.dashboard_url.rsplit(":", 1)[1]))
    link.up.set()
    try:
        thread, errors, sid = _check_in_the_background(link, "poll")
        link.drops = 1  # the next poll gets no answer; the head answers the stop
        thread.join(30)
        (error,) = errors
        assert isinstance(error, fabric.FabricError)
        assert str(error).startswith(f"fabric check {sid}: its status poll failed (Ray head at the test head: GET ")
        assert str(error).endswith("; it was stopped")
        _await_status(two_gpu_nodes, sid, "STOPPED")
    finally:
        link.close()


def test_a_check_left_running_by_a_lost_head_is_a_live_run_the_next_create_stops(two_gpu_nodes: RayHead):
    stack = f"t{uuid.uuid4().hex[:8]}"
    link = FlakyLink(int(two_gpu_nodes.dashboard_url.rsplit(":", 1)[1]))
    link.up.set()
    try:
        thread, errors, sid = _check_in_the_background(link, stack)
        link.up.clear()  # the head stops answering: neither the poll nor the stop gets through
        thread.join(30)
        (error,) = errors
        assert "could not be stopped (Ray head at the test head: POST " in str(error)
        assert str(error).endswith("and may still hold the GPUs: the next deploy of the stack stops it before "
                                   "submitting the run")
    finally:
        link.close()
    assert _status(two_gpu_nodes, sid) in ("PENDING", "RUNNING")
    jobs = JobSubmissionClient(two_gpu_nodes.dashboard_url).list_jobs()
    # Counted as a live run of the stack by the one-live-run check...
    props = _props(two_gpu_nodes, stack=stack, fabric_check=False, expected_workers=0)
    with pytest.raises(RuntimeError, match=f"another run or a model export of stack {stack} is live on .*: {sid}\\. "):
        refuse_a_second_run(jobs, JobSpec.from_props(props))
    # ...which a create ends before it submits.
    result = GrpoJobProvider().create(props)
    assert _status(two_gpu_nodes, sid) == "STOPPED"
    assert _status(two_gpu_nodes, result.id) in ("PENDING", "RUNNING", "SUCCEEDED")


def test_fabric_checks_of_a_stack_are_told_by_their_whole_id():
    assert fabric.is_check_of("verl-fabric-a4-0123abcd", "a4")
    assert not fabric.is_check_of("verl-fabric-a4-standard-0123abcd", "a4")
    assert not fabric.is_check_of("verl-grpo-a4-0123abcd", "a4")


def _props(head: RayHead, **extra) -> dict:
    return {"dashboard_url": head.dashboard_url, "stack": f"t{uuid.uuid4().hex[:8]}", "runtime_env": {},
            "entrypoint": f"{sys.executable} -c 'print(1)'", "startup_grace_s": 0, "expected_workers": 2,
            "expected_gpus": 4, "fabric_check": True, "fabric_backend": "gloo", "fabric_python": sys.executable,
            "ready_timeout_s": 240, "fabric_timeout_s": 240, **extra}


def test_create_measures_the_fabric_then_submits_and_reports_the_figure(two_gpu_nodes: RayHead, created):
    result, check, measured = created
    assert check == fabric.FabricCheck(nodes=2, gpus_per_node=2, min_busbw_gbps=0.0001, backend="gloo",
                                       python=sys.executable, timeout_s=240)
    assert (check.size_mb, check.iters) == (256, 20)  # what a deploy measures with
    assert measured["submission_id"].startswith(f"verl-fabric-{result.outs['stack']}-")
    assert result.outs["fabric_busbw_gbps"] == measured["busbw_gbps"] > 0
    assert JobSubmissionClient(two_gpu_nodes.dashboard_url).get_job_info(result.id).entrypoint.endswith("'print(1)'")


def test_create_below_the_floor_fails_and_submits_no_run(two_gpu_nodes: RayHead, measured: dict, monkeypatch):
    monkeypatch.setattr(fabric, "run_fabric_check", lambda *_args: measured)  # these nodes' figure, measured once
    props = _props(two_gpu_nodes, fabric_min_busbw_gbps=1e6)
    with pytest.raises(fabric.FabricError) as caught:
        GrpoJobProvider().create(props)
    assert "below the 1e+06 GB/s floor" in str(caught.value)
    jobs = JobSubmissionClient(two_gpu_nodes.dashboard_url).list_jobs()
    assert not [j for j in jobs if (j.submission_id or "").startswith(f"verl-grpo-{props['stack']}-")]


def test_verl_gke_fabric_prints_the_figure_and_fails_below_the_floor(two_gpu_nodes: RayHead, measured: dict, tmp_path,
                                                                     capsys, monkeypatch):
    from tests.test_cli import outputs_doc, write_outputs
    from verl_gke import cli

    outputs = write_outputs(tmp_path / "outputs.json", outputs_doc("verl-grpo-x", gpusPerNode=2))
    base = ["fabric", "--outputs", str(outputs), "--dashboard-url", two_gpu_nodes.dashboard_url, "--backend", "gloo",
            "--python", sys.executable, "--size-mb", "4", "--head-timeout", "60"]
    asked: list[tuple[fabric.FabricCheck, str]] = []

    def these_nodes(client: JobSubmissionClient, check: fabric.FabricCheck, stack: str) -> dict:
        # These nodes' figure, measured once (by the provider's create): a check on real Ray is that test's.
        asked.append((check, stack))
        return measured

    monkeypatch.setattr(fabric, "run_fabric_check", these_nodes)
    assert cli.main([*base, "--min-busbw", "0.0001"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"bus bandwidth {measured['busbw_gbps']:g} GB/s ")
    assert f"over 2 nodes x 2 GPUs, gloo, job {measured['submission_id']}\n" in out
    assert "\nNCCL transports: none logged\n" in out
    ((check, stack),) = asked
    assert stack == "a4" and (check.nodes, check.gpus_per_node, check.backend, check.python, check.size_mb) == (
        2, 2, "gloo", sys.executable, 4)
    assert cli.main([*base, "--min-busbw", "1e6"]) == 1
    assert "below the 1e+06 GB/s floor (verl-gke:fabricMinBusBandwidthGbps)" in capsys.readouterr().err


# NCCL INFO connection lines as NCCL prints them, each behind Ray's worker prefix. Formats:
# src/debug.cc ("<host>:<pid>:<tid> [<dev>] NCCL INFO "), src/transport/net.cc sendSetup/recvSetup
# ("Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s"; "%d(%d)" with a PXN proxy rank),
# src/transport/p2p.cc ("... via P2P/%s%s%s": MNNVL or CUMEM, /read; "via P2P/IPC%s" without cuMem),
# src/transport/shm.cc ("via SHM/%s/%s").
NCCL_LINES = {
    "NET/gIB": "(Rank pid=311, ip=10.8.0.5) gke-a4-gpu-pool-1:311:402 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] "
               "[send] via NET/gIB/0/GDRDMA",
    "NET/IB": "(Rank pid=311, ip=10.8.0.5) gke-a3u-gpu-pool-1:311:402 [3] NCCL INFO Channel 03/1 : 11[3] -> 3[3] "
              "[receive] via NET/IB/3(2)/GDRDMA/Shared",
    "NET/Socket": "(Rank pid=311, ip=10.8.0.5) gke-a4-gpu-pool-1:311:402 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] "
                  "[send] via NET/Socket/0",
    "P2P/MNNVL": "(Rank pid=90, ip=10.8.1.2) gke-a4x-gpu-pool-3:90:171 [1] NCCL INFO Channel 05/1 : 1[1] -> 5[1] "
                 "via P2P/MNNVL/read",
    "P2P/IPC": "(Rank pid=311, ip=10.8.0.5) gke-a4-gpu-pool-1:311:402 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] "
               "via P2P/IPC/read",
    "SHM": "gke-a4-gpu-pool-1:311:402 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
}
NOT_CONNECTIONS = [
    "gke-a4-gpu-pool-1:311:402 [0] NCCL INFO NET/Plugin: Loaded net plugin gIB (v8)",
    "gke-a4-gpu-pool-1:311:402 [0] NCCL INFO Using network gIB",
    "gke-a4-gpu-pool-1:311:402 [0] NCCL INFO Connected all rings, use ring PXN 1 GDR 1",
]


@pytest.mark.parametrize("transport", NCCL_LINES)
def test_each_kind_of_nccl_connection_line_names_its_transport(transport: str):
    assert nccl_transports("\n".join([*NOT_CONNECTIONS, NCCL_LINES[transport]])) == {transport: 1}


def _judged(transports: dict[str, int], platform: str, nodes: int = 2, backend: str = "nccl") -> str | None:
    from domain.platforms import PLATFORMS

    check = fabric.FabricCheck(nodes=nodes, gpus_per_node=8, min_busbw_gbps=1.0, backend=backend,
                               transports=PLATFORMS[platform].fabric_transports)
    result = {"submission_id": "verl-fabric-x", "nodes": nodes, "busbw_gbps": 300.0, "backend": backend,
              "transports": transports}
    return fabric.verdict(result, check)


@pytest.mark.parametrize(("platform", "transports"), [
    ("a4", {"NET/gIB": 32, "P2P/IPC": 28}),
    ("a3u", {"NET/IB": 32}),
    ("a4x", {"P2P/MNNVL": 48, "P2P/CUMEM": 12}),
])
def test_the_platforms_own_transport_passes(platform: str, transports: dict[str, int]):
    assert _judged(transports, platform) is None


def test_a_fallback_to_tcp_fails_naming_it():
    assert _judged({"NET/Socket": 32, "P2P/IPC": 28}, "a4") == (
        "fabric check verl-fabric-x: NCCL connected GPUs via NET/Socket, not NET/gIB or NET/IB (NET/Socket is TCP): "
        "the RDMA or NVLink path is not in use (its NCCL plugin, the NICs or the network attachments). Training "
        "would run many times slower; fix it, or turn verl-gke:fabricCheck off to train anyway.")
    # Some channels over RDMA do not excuse the others over TCP.
    assert "via NET/Socket, not" in _judged({"NET/gIB": 16, "NET/Socket": 16}, "a3u")


def test_a4x_between_nodes_over_roce_instead_of_nvlink_fails():
    assert "via NET/gIB, not P2P/MNNVL" in _judged({"NET/gIB": 32, "P2P/CUMEM": 12}, "a4x")
    assert _judged({"P2P/CUMEM": 12}, "a4x") == (
        "fabric check verl-fabric-x: NCCL never connected GPUs via P2P/MNNVL (seen: P2P/CUMEM x12); training "
        "would not use the platform's fabric. Check the NCCL lines of the job's log, or turn "
        "verl-gke:fabricCheck off to train anyway.")


def test_no_transport_is_judged_on_one_node_or_without_nccl():
    assert _judged({}, "a4", nodes=1) is None
    assert _judged({}, "a4", backend="gloo") is None


def test_the_check_measures_with_the_runs_nccl_env_and_what_verl_adds():
    from domain.grpo_spec import runtime_env
    from domain.platforms import PLATFORMS

    for platform in PLATFORMS.values():
        env = fabric.fabric_runtime_env(platform)["env_vars"]
        run = runtime_env(platform, nnodes=2, worker_cpus=1, verl_dir=None)["env_vars"]
        assert {k: v for k, v in run.items() if k.startswith("NCCL_")} == {
            k: v for k, v in env.items() if k.startswith("NCCL_") and k not in platform.verl.nccl_env}
        assert env["LD_LIBRARY_PATH"] == run["LD_LIBRARY_PATH"]
        assert {k: env[k] for k in platform.verl.nccl_env} == platform.verl.nccl_env


@pytest.mark.parametrize("version", ["0.6.1", "0.9.0"])
def test_verls_own_nccl_additions_are_in_the_table(version: str):
    """verl's PPO_RAY_RUNTIME_ENV (verl/trainer/constants_ppo.py of the pinned wheel, read as source:
    importing it needs CUDA queries on 0.9.0): its NCCL_* literals, less those the job sets itself
    (verl drops a key the job's env already has: NCCL_DEBUG)."""
    import ast

    from domain.grpo_spec import runtime_env
    from domain.platforms import PLATFORMS
    from domain.verl_wheel import unpacked

    platform = next(p for p in PLATFORMS.values() if p.verl.version == version)
    tree = ast.parse((unpacked(platform.verl) / "verl" / "trainer" / "constants_ppo.py").read_text())
    (assign,) = [n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "PPO_RAY_RUNTIME_ENV"]
    env_vars = next(v for k, v in zip(assign.value.keys, assign.value.values) if ast.literal_eval(k) == "env_vars")
    verls = {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(env_vars.keys, env_vars.values)
             if k is not None and ast.literal_eval(k).startswith("NCCL_")}
    job = runtime_env(platform, nnodes=2, worker_cpus=1, verl_dir=None)["env_vars"]
    assert {k: v for k, v in verls.items() if k not in job} == platform.verl.nccl_env


"""`verl-gke verify`: the checks over stand-in facts (a passing stack, one FAIL per check with its line,
NOT CHECKED where a fact is missing), the facts read from stand-in answers shaped as GCP, GKE and the
Kubernetes API document them, and its bad input."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from verl_gke import cli, verify
from verl_gke.verify import ComputeDomainState, Container, Facts, Nat, NodePool

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
IMAGE = f"us-central1-docker.pkg.dev/p/docker-hub/verlai/verl:vllm011@{DIGEST}"
# The job log lines workloads/checkpoints.py prints (its _log: `verl-gke checkpoints: ...`).
RUN_LOG = ("verl-gke checkpoints: step 10: saved by verl on every node, copying\n"
           "verl-gke checkpoints: step 20: saved by verl on every node, copying\n"
           "verl-gke checkpoints: step 30: saved by verl on every node, copying\n"
           "verl-gke checkpoints: step 30: verl's last save (its trainer ran on b200-ray-cluster-head-x7k2p)\n")


def passing(**changes: Any) -> Facts:
    """An A4 Standard stack as it should be."""
    facts = Facts(
        platform="a4", gpu_nodes=2, gke_version="1.34.1-gke.1829001", autopilot=False,
        datapath="ADVANCED_DATAPATH", workload_pool="my-project.svc.id.goog",
        node_pools=(NodePool("cpu-pool", "pd-balanced", "GKE_METADATA", False),
                    NodePool("gpu-reservation", "hyperdisk-balanced", "GKE_METADATA", True)),
        dranet=False, networks={"verl-a4-net": 8896, "verl-a4-gvnic": 8896}, cluster_network="verl-a4-net",
        nats=(Nat("verl-a4-router", "verl-a4-nat", "verl-a4-net", True, 4096, 65536),),
        containers=(Container("b200-ray-cluster-head-x7k2p", "ray-head", IMAGE, f"docker.io/verlai/verl@{DIGEST}"),),
        ray_version="2.47.0", run_log=RUN_LOG, bucket_steps=(20, 30), fabric_busbw_gbps=361.5, released=False,
        ray_pods=3, workers=(("b200-ray-cluster-gpu-workers-worker-a1b2c", "Running"),
                             ("b200-ray-cluster-gpu-workers-worker-d3e4f", "Running")))
    return replace(facts, **changes)


def lines(facts: Facts) -> list[str]:
    return [r.line() for r in verify.checks(facts)]


def test_a_passing_stack_passes_every_check_with_its_evidence() -> None:
    assert lines(passing()) == [
        "PASS         gke-version (the cluster): seen 1.34.1-gke.1829001; expected >= 1.34",
        "PASS         network-policy-enforced: seen datapathProvider ADVANCED_DATAPATH; expected ADVANCED_DATAPATH "
        "(Dataplane V2 enforces NetworkPolicy)",
        "PASS         workload-identity: seen my-project.svc.id.goog; 2 node pools at GKE_METADATA; expected a "
        "workload pool and every node pool at GKE_METADATA",
        "PASS         vpc-mtu: seen verl-a4-gvnic 8896, verl-a4-net 8896; expected MTU 8896 on every VPC",
        "PASS         cloud-nat: seen verl-a4-router/verl-a4-nat: dynamic port allocation on, 4096-65536 ports per "
        "VM; expected a NAT on verl-a4-net with dynamic port allocation, 4096-65536 ports per VM",
        "PASS         boot-disk: seen gpu-reservation hyperdisk-balanced; expected hyperdisk-balanced",
        "PASS         images-by-digest: seen 1 containers by digest; expected every container's image pinned @sha256 "
        "and running that digest",
        "PASS         ray-version: seen the head reports Ray 2.47.0; expected 2.47.0",
        "PASS         trainer-placement: seen step 30: trainer on b200-ray-cluster-head-x7k2p; expected the head or "
        "a GPU worker",
        "PASS         saves-in-bucket: seen saved steps 10, 20, 30; complete in the bucket steps 20, 30; expected "
        "every save verl made (newer than the oldest kept) complete in the bucket",
        "PASS         fabric-busbw: seen 361.5 GB/s all-reduce bus bandwidth; expected >= 200 GB/s",
        "PASS         gpu-workers-admitted: seen 2 Running; expected 2 GPU worker pods Running",
        "NOT CHECKED  release: seen the run is not released yet; expected no pod of the RayCluster once the record "
        "says released",
    ]


A4X = dict(platform="a4x", gpu_nodes=4, dranet=True, ray_version="2.49.0",
           node_pools=(NodePool("gpu-reservation", "hyperdisk-balanced", "GKE_METADATA", True),),
           run_log=RUN_LOG.replace("b200-ray-cluster-head-x7k2p", "gb200-ray-cluster-gpu-workers-worker-abcde"),
           compute_domain=ComputeDomainState("Ready", 4, 4), fabric_busbw_gbps=512.0,
           workers=tuple((f"gb200-ray-cluster-gpu-workers-worker-{i}", "Running") for i in range(4)))


def test_an_a4x_stack_checks_its_floors_the_compute_domain_and_imex_channels() -> None:
    out = lines(passing(**A4X))
    assert out[:2] == [
        "PASS         gke-version (A4X (4x NVIDIA GB200, arm64) (DRA resource.k8s.io/v1)): seen 1.34.1-gke.1829001; expected >= 1.34",
        "PASS         gke-version (DRANET): seen 1.34.1-gke.1829001; expected >= 1.34.1-gke.1829001",
    ]
    assert out[-2:] == [
        "PASS         compute-domain: seen verl-compute-domain status Ready over 4 nodes; expected status Ready over "
        "4 nodes",
        "PASS         imex-channels: seen 4 IMEX channel claims allocated; expected >= 4 IMEX channel claims allocated "
        "by compute-domain.nvidia.com",
    ]
    assert [line.split(":")[0] for line in out if not line.startswith("PASS")] == ["NOT CHECKED  release"]


# One broken fact per check, and the exact line it must give.
FAILS: list[tuple[dict[str, Any], str]] = [
    ({**A4X, "gke_version": "1.34.0-gke.100"},
     "FAIL         gke-version (DRANET): seen 1.34.0-gke.100; expected >= 1.34.1-gke.1829001"),
    (dict(datapath="LEGACY_DATAPATH"),
     "FAIL         network-policy-enforced: seen datapathProvider LEGACY_DATAPATH; expected ADVANCED_DATAPATH "
     "(Dataplane V2 enforces NetworkPolicy)"),
    (dict(node_pools=(NodePool("gpu-reservation", "hyperdisk-balanced", "GCE_METADATA", True),)),
     "FAIL         workload-identity: seen workload pool my-project.svc.id.goog; gpu-reservation GCE_METADATA; "
     "expected a workload pool and every node pool at GKE_METADATA"),
    (dict(networks={"verl-a4-net": 1460}),
     "FAIL         vpc-mtu: seen verl-a4-net 1460; expected MTU 8896 on every VPC"),
    (dict(nats=(Nat("verl-a4-router", "verl-a4-nat", "verl-a4-net", False, 64, 0),)),
     "FAIL         cloud-nat: seen verl-a4-router/verl-a4-nat: dynamic port allocation off, 64-0 ports per VM; "
     "expected a NAT on verl-a4-net with dynamic port allocation, 4096-65536 ports per VM"),
    (dict(node_pools=(NodePool("gpu-reservation", "pd-balanced", "GKE_METADATA", True),)),
     "FAIL         boot-disk: seen gpu-reservation pd-balanced; expected hyperdisk-balanced"),
    (dict(containers=(Container("head", "ray-head", IMAGE, f"docker.io/verlai/verl@{OTHER}"),
                      Container("head", "copier", "python:3.12-slim", ""))),
     f"FAIL         images-by-digest: seen head/ray-head runs {OTHER}, pinned {DIGEST}; head/copier "
     "python:3.12-slim (no digest); expected every container's image pinned "
     "@sha256 and running that digest"),
    (dict(ray_version="2.49.0"),
     "FAIL         ray-version: seen the head reports Ray 2.49.0; expected 2.47.0"),
    ({**A4X, "run_log": RUN_LOG.replace("b200-ray-cluster-head-x7k2p", "gb200-ray-cluster-head-q8r4t")},
     "FAIL         trainer-placement: seen step 30: trainer on gb200-ray-cluster-head-q8r4t; expected a GPU worker "
     "(the head takes no Ray CPUs)"),
    (dict(bucket_steps=(20,)),
     "FAIL         saves-in-bucket: seen saved steps 10, 20, 30; complete in the bucket steps 20; missing steps 30; "
     "expected every save verl made (newer than the oldest kept) complete in the bucket"),
    (dict(fabric_busbw_gbps=18.2),
     "FAIL         fabric-busbw: seen 18.2 GB/s all-reduce bus bandwidth; expected >= 200 GB/s"),
    (dict(workers=(("b200-ray-cluster-gpu-workers-worker-a1b2c", "Running"),
                   ("b200-ray-cluster-gpu-workers-worker-d3e4f", "0/3 nodes are available: 1 Insufficient nvidia.com/gpu. "
                    "preemption: not eligible"))),
     "FAIL         gpu-workers-admitted: seen 1 Running; b200-ray-cluster-gpu-workers-worker-d3e4f: 0/3 nodes are "
     "available: 1 Insufficient nvidia.com/gpu. preemption: not eligible; expected 2 GPU worker pods Running"),
    (dict(released=True, workers=()),
     "FAIL         release: seen released; 3 Ray pods left; expected no pod of the RayCluster once the record says "
     "released"),
    ({**A4X, "compute_domain": ComputeDomainState("NotReady", 3, 4)},
     "FAIL         compute-domain: seen verl-compute-domain status NotReady over 3 nodes; expected status Ready "
     "over 4 nodes"),
    ({**A4X, "compute_domain": ComputeDomainState("Ready", 4, 2)},
     "FAIL         imex-channels: seen 2 IMEX channel claims allocated; expected >= 4 IMEX channel claims "
     "allocated by compute-domain.nvidia.com"),
]


@pytest.mark.parametrize("changes,line", FAILS, ids=[line.split(":")[0].split()[-1] for _, line in FAILS])
def test_each_check_fails_with_the_value_seen_and_expected(changes: dict[str, Any], line: str) -> None:
    out = lines(passing(**changes))
    assert [x for x in out if x.startswith("FAIL")] == [line]


def test_every_check_has_a_fail_case() -> None:
    names = {line.split(":")[0].split("  ")[-1].strip().split(" (")[0] for _, line in FAILS}
    every = {r.check.split(" (")[0] for r in verify.checks(passing(**A4X))}
    assert names == every


def test_a_fact_not_read_is_not_checked_with_the_reason() -> None:
    facts = passing(ray_version=None, networks=None, missing={"ray_version": "GET /api/v1/...: 503 no endpoints",
                                                              "networks": "gcloud not found on PATH"})
    out = [x for x in lines(facts) if not x.startswith("PASS") and "release:" not in x]
    assert out == [
        "NOT CHECKED  vpc-mtu: seen nothing (gcloud not found on PATH); expected MTU 8896 on every VPC",
        "NOT CHECKED  ray-version: seen nothing (GET /api/v1/...: 503 no endpoints); expected 2.47.0",
    ]


def test_a_released_run_has_no_pod_left_and_its_workers_are_not_counted() -> None:
    out = lines(passing(released=True, ray_pods=0, workers=()))
    assert [x for x in out if "release" in x] == [
        "NOT CHECKED  gpu-workers-admitted: seen the run is released (its workers are gone by design); expected 2 GPU "
        "worker pods Running",
        "PASS         release: seen released; 0 Ray pods left; expected no pod of the RayCluster once the record says "
        "released",
    ]


def test_autopilot_leaves_the_boot_disk_to_gke() -> None:
    [disk] = [x for x in lines(passing(autopilot=True)) if "boot-disk" in x]
    assert disk == ("NOT CHECKED  boot-disk: seen Autopilot (GKE picks the GPU nodes' boot disk); expected "
                    "hyperdisk-balanced")


# --- the facts from stand-in answers --------------------------------------------------------------


def cluster_answer() -> dict[str, Any]:
    """`gcloud container clusters describe --format json`: the fields of GKE's Cluster resource that verify reads
    (cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters#Cluster, NodePool,
    NodeConfig.workloadMetadataConfig, NodeNetworkConfig.additionalNodeNetworkConfigs)."""
    return {
        "name": "verl-a4", "currentMasterVersion": "1.34.1-gke.1829001",
        "network": "projects/p/global/networks/verl-a4-net",
        "networkConfig": {"datapathProvider": "ADVANCED_DATAPATH"},
        "workloadIdentityConfig": {"workloadPool": "my-project.svc.id.goog"},
        "nodePools": [
            {"name": "cpu-pool", "config": {"machineType": "c2-standard-16", "diskType": "pd-balanced",
                                            "workloadMetadataConfig": {"mode": "GKE_METADATA"}}},
            {"name": "gpu-reservation",
             "config": {"machineType": "a4-highgpu-8g", "diskType": "hyperdisk-balanced",
                        "accelerators": [{"acceleratorCount": "8", "acceleratorType": "nvidia-b200"}],
                        "workloadMetadataConfig": {"mode": "GKE_METADATA"}},
             "networkConfig": {"additionalNodeNetworkConfigs": [
                 {"network": "verl-a4-gvnic", "subnetwork": "verl-a4-gvnic-sub"}]}},
        ],
    }


ROUTERS = [{"name": "verl-a4-router", "network": "https://www.googleapis.com/compute/v1/projects/p/global/networks/"
            "verl-a4-net", "nats": [{"name": "verl-a4-nat", "enableDynamicPortAllocation": True,
                                     "minPortsPerVm": 4096, "maxPortsPerVm": 65536}]}]


@pytest.fixture
def gcloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `gcloud` first on PATH answering by its arguments as the real one does with `--format json` (Cluster,
    Network.mtu, Router.nats), and `storage ls` with the objects' gs:// URLs; every call is recorded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "clusters").write_text(json.dumps(cluster_answer()))
    (answers / "networks-verl-a4-net").write_text(json.dumps({"name": "verl-a4-net", "mtu": 8896}))
    (answers / "networks-verl-a4-gvnic").write_text(json.dumps({"name": "verl-a4-gvnic", "mtu": 8896}))
    (answers / "routers").write_text(json.dumps(ROUTERS))
    (answers / "storage-ls").write_text("".join(
        f"gs://verl-data/verl/checkpoints/run-1/global_step_{s}/.verl-gke-complete.json\n" for s in (20, 30)))
    script = bin_dir / "gcloud"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> "{tmp_path}/calls"\n'
        f'A="{answers}"\n'
        'case "$1 $2" in\n'
        '  "container clusters") cat "$A/clusters";;\n'
        '  "compute networks") cat "$A/networks-$4";;\n'
        '  "compute routers") cat "$A/routers";;\n'
        '  "storage ls") cat "$A/storage-ls";;\n'
        '  "storage cp") cp "$3" "' + str(tmp_path) + '/uploaded.json";;\n'
        '  *) echo "ERROR: unexpected $*" >&2; exit 1;;\n'
        'esac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


class Api:
    """Answers GET paths as the Kubernetes API does: a PodList, the service proxy's reply of the Ray dashboard's
    /api/version ({"ray_version": ...}: ray dashboard/modules/version), None for 404."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def request(self, method: str, path: str) -> Any:
        assert method == "GET"
        return self.answers.get(path)


PODS = {"items": [
    {"metadata": {"name": "b200-ray-cluster-head-x7k2p"},
     "spec": {"containers": [{"name": "ray-head", "image": IMAGE},
                             {"name": "gke-gcsfuse-sidecar", "image": "gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter"}]},
     "status": {"phase": "Running", "containerStatuses": [{"name": "ray-head",
                                                           "imageID": f"docker.io/verlai/verl@{DIGEST}"}]}},
    {"metadata": {"name": "stage-data-abc"}, "spec": {"containers": [{"name": "stage", "image": "python:3.12"}]},
     "status": {"phase": "Succeeded"}},
]}


# A KubeRay worker pod (label ray.io/node-type=worker).
WORKER = {"metadata": {"name": "b200-ray-cluster-gpu-workers-worker-a1b2c",
                       "labels": {"ray.io/cluster": "b200-ray-cluster", "ray.io/node-type": "worker"}},
          "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}}


def outputs(**changes: Any) -> verify.StackOutputs:
    from verl_gke.stack_outputs import from_mapping

    doc = {"bucketName": "verl-data", "checkpointUri": "gs://verl-data/verl/checkpoints/run-1",
           "clusterLocation": "us-central1-b", "clusterName": "verl-a4",
           "clusterEndpoint": "34.9.9.9", "dashboardCommand": "kubectl port-forward ...", "gpuNodes": 2,
           "gpuPlatform": "a4", "gpusPerNode": 8, "grpoJobStatus": "RUNNING", "grpoSubmissionId": "verl-grpo-1",
           "namespace": "default", "rayHeadService": "b200-ray-cluster-head-svc", "runId": "run-1",
           "fabricBusBandwidthGbps": 361.5,
           "clusterCaCertificate": base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n").decode(), **changes}
    return from_mapping(doc, "outputs.json")


def bucket_copy(name: str) -> str | None:
    record = json.dumps({"version": 2, "run_id": "run-1", "attempts": [
        {"index": 0, "submission_id": "verl-grpo-1", "by": "pulumi-up", "cause": "pulumi-up"}]})
    return {"record.json": record, "attempt-0.log": RUN_LOG}.get(name)


def test_the_facts_come_from_gcloud_the_cluster_api_and_the_bucket(gcloud: Path) -> None:
    api = Api({"/api/v1/namespaces/default/pods": PODS,
               "/api/v1/namespaces/default/pods?labelSelector=ray.io%2Fcluster%3Db200-ray-cluster":
                   {"items": [PODS["items"][0], WORKER]},
               "/api/v1/namespaces/default/services/b200-ray-cluster-head-svc:dashboard/proxy/api/version":
                   {"ray_version": "2.47.0"}})
    out = outputs()
    facts = verify.gather(out, api, bucket_copy, verify._bucket(out)[1])
    assert facts == passing(missing={}, ray_pods=2, workers=(("b200-ray-cluster-gpu-workers-worker-a1b2c", "Running"),))
    calls = (gcloud / "calls").read_text().splitlines()
    assert calls == [
        "container clusters describe verl-a4 --location us-central1-b --format json",
        "compute networks describe verl-a4-gvnic --format json",
        "compute networks describe verl-a4-net --format json",
        "compute routers list --regions us-central1 --format json",
        "storage ls gs://verl-data/verl/checkpoints/run-1/global_step_*/.verl-gke-complete.json",
    ]


def test_the_command_prints_each_line_uploads_the_json_and_fails_on_a_fail(
        gcloud: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (gcloud / "answers" / "networks-verl-a4-gvnic").write_text(json.dumps({"name": "verl-a4-gvnic", "mtu": 1460}))
    monkeypatch.setattr(verify, "_api", lambda args, out: None)
    monkeypatch.setattr("verl_gke.runs.BucketCopy.read", lambda self, name: bucket_copy(name))
    path = tmp_path / "outputs.json"
    doc = {"bucketName": "verl-data", "checkpointUri": "gs://verl-data/verl/checkpoints/run-1",
           "clusterLocation": "us-central1-b", "clusterName": "verl-a4", "clusterEndpoint": "34.9.9.9",
           "clusterCaCertificate": base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n").decode(),
           "dashboardCommand": "kubectl ...", "gpuNodes": 2, "gpuPlatform": "a4", "gpusPerNode": 8,
           "grpoJobStatus": "RUNNING", "grpoSubmissionId": "verl-grpo-1", "namespace": "default",
           "rayHeadService": "b200-ray-cluster-head-svc", "runId": "run-1", "fabricBusBandwidthGbps": 361.5}
    path.write_text(json.dumps(doc))
    code = cli.main(["verify", "--outputs", str(path)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert "FAIL         vpc-mtu: seen verl-a4-gvnic 1460, verl-a4-net 8896; expected MTU 8896 on every VPC" in out
    assert "NOT CHECKED  images-by-digest: seen nothing (no Kubernetes API); expected every container's image " \
           "pinned @sha256 and running that digest" in out
    uploaded = json.loads((gcloud / "uploaded.json").read_text())
    assert (uploaded["run"], uploaded["failed"]) == ("run-1", 1)
    assert "storage cp" in (gcloud / "calls").read_text().splitlines()[-1]
    assert (gcloud / "calls").read_text().splitlines()[-1].endswith(" gs://verl-data/logs/run-1/verify.json")
    assert cli.main(["verify", "--outputs", str(path), "--json", "--no-upload"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert [r["check"] for r in printed["results"] if r["status"] == "FAIL"] == ["vpc-mtu"]


def test_nothing_deployed_is_one_line_naming_the_missing_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"checkpointUri": "gs://verl-data/verl/checkpoints/run-1", "clusterLocation": "us-central1-b",
           "clusterName": "verl-a4", "dashboardCommand": "kubectl ...", "gpuNodes": 2, "gpuPlatform": "a4",
           "gpusPerNode": 8, "grpoJobStatus": "[unknown]", "grpoSubmissionId": "verl-grpo-1", "namespace": "default",
           "rayHeadService": "b200-ray-cluster-head-svc", "runId": "run-1"}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["verify", "--outputs", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == f"verl-gke: error: nothing to verify: the stack outputs in {path} have no bucketName (is the " \
                  "stack deployed?)\n"
    path.write_text("{}")
    assert cli.main(["verify", "--outputs", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"verl-gke: error: nothing to verify: {path} lacks stack outputs clusterName, ")
    assert len(err.splitlines()) == 1


def test_verify_help_lists_only_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    out = capsys.readouterr().out
    flags = sorted({word.rstrip(",") for word in out.split() if re.fullmatch(r"--[a-z-]+,?", word)})
    assert flags == ["--help", "--json", "--kube-api-url", "--no-upload", "--outputs", "--stack"]


def test_the_a4x_facts_come_from_the_compute_domain_and_the_allocated_claims() -> None:
    # The NVIDIA DRA driver's ComputeDomain status (status.status, status.nodes[]) and ResourceClaims whose
    # status.allocation.devices.results[] name the allocating driver (resource.k8s.io/v1 AllocationResult).
    domain = {"status": {"status": "Ready", "nodes": [{"name": f"n{i}", "status": "Ready"} for i in range(4)]}}
    imex = {"status": {"allocation": {"devices": {"results": [
        {"driver": "compute-domain.nvidia.com", "pool": "n0", "device": "channel-0", "request": "channel"}]}}}}
    nic = {"status": {"allocation": {"devices": {"results": [{"driver": "dra.net", "device": "rdma0"}]}}}}
    claims = {"items": [imex, imex, imex, nic, {"status": {}}]}
    assert verify.compute_domain_of(domain, claims) == ComputeDomainState("Ready", 4, 3)
    assert verify.compute_domain_of(None, {}) == ComputeDomainState("", 0, 0)


def test_synths_offline_outputs_have_nothing_to_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"bucketName": "verl-data", "checkpointUri": "gs://verl-data/verl/checkpoints/run-1",
           "clusterLocation": "us-central1-b", "clusterName": "verl-a4", "clusterEndpoint": "[unknown]",
           "clusterCaCertificate": "c3ludGgtY2E=", "dashboardCommand": "kubectl ...", "gpuNodes": 2,
           "gpuPlatform": "a4", "gpusPerNode": 8, "grpoJobStatus": "[unknown]", "grpoSubmissionId": "verl-grpo-1",
           "namespace": "default", "rayHeadService": "b200-ray-cluster-head-svc", "runId": "run-1"}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["verify", "--outputs", str(path)]) == 1
    assert capsys.readouterr().err == (f"verl-gke: error: nothing to verify: {path} holds synth's offline outputs "
                                       "(clusterCaCertificate is a stand-in)\n")

"""The run's record, the cluster's decider Lease and its RayCluster, through the Kubernetes API, as
the GrpoJob provider uses them (docs/run-lifecycle.md)."""

from __future__ import annotations

import pulumi

from access.cluster_api import cluster_api
from access.kubeconfig import is_dns_endpoint
from components.job_spec import JobSpec
from workloads import run_lifecycle
from workloads.kube import KubernetesApi, RayClusterControl
from workloads.run_lease import PULUMI_UP, HeldLease, Lease, identity
from workloads.run_record import MemoryRecords, RecordStore


def kube_api(spec: JobSpec) -> KubernetesApi | None:
    """The cluster's Kubernetes API (see GrpoJobArgs.kube_api_url); None when neither is given."""
    timeout = spec.reach_timeout_s
    if spec.kube_api_url:
        return KubernetesApi(spec.kube_api_url, timeout_s=timeout)
    if spec.cluster_endpoint and (spec.cluster_ca_certificate or is_dns_endpoint(spec.cluster_endpoint)):
        return cluster_api(spec.cluster_endpoint, spec.cluster_ca_certificate, timeout)
    return None


def records(spec: JobSpec) -> RecordStore | MemoryRecords:
    """Where the run records are kept (for the call only without a Kubernetes API)."""
    api = kube_api(spec)
    return MemoryRecords() if api is None else RecordStore(api, spec.namespace, spec.ray_cluster)


def lease(spec: JobSpec) -> Lease | HeldLease:
    """The cluster's decider Lease (always held without a Kubernetes API: nothing else decides)."""
    api = kube_api(spec)
    return HeldLease() if api is None else Lease(api, spec.namespace, spec.ray_cluster, identity(PULUMI_UP),
                                                 log=pulumi.log.info)


def resume_cluster(spec: JobSpec, held: Lease | HeldLease) -> None:
    """Brings back a RayCluster an earlier run's end released (suspended), before the readiness
    gate waits for it: the same field and field manager as the decider's release. Nothing to do
    without the API or the head service."""
    api = kube_api(spec)
    if api is None or not spec.head_service:
        return
    held.check()
    try:
        RayClusterControl(api, spec.namespace, spec.ray_cluster).set_suspended(False)
    except Exception as error:  # noqa: BLE001 - one line naming what was being done
        raise RuntimeError(f"GrpoJob: resuming RayCluster {spec.namespace}/{spec.ray_cluster} (spec.suspend: "
                           f"false) failed: {error}") from None


def stop_through_cluster(spec: JobSpec, kept: RecordStore | MemoryRecords, held: Lease | HeldLease) -> bool:
    """A delete whose head does not answer (Pending on a CPU pool at zero, a stalled dashboard) while the
    Kubernetes API does: suspends the RayCluster, which stops every attempt with its pods (KubeRay 1.6.2
    deletes every pod of a suspended cluster, the head's included, and resumes only once none is left, so a
    replacement's create that resumes it cannot overlap them), and records the run released. False (the
    delete fails) without the API or the RayCluster: then nothing says the run stopped."""
    api = kube_api(spec)
    if api is None:
        return False
    held.check()
    if not RayClusterControl(api, spec.namespace, spec.ray_cluster).set_suspended(True):
        return False
    where = f"{spec.namespace}/{spec.ray_cluster}"
    run_lifecycle.write_record(kept, spec.run_key, lambda r: None if r is None else
                               run_lifecycle.suspended_by_stack(r, where), held)
    return True

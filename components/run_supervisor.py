"""The run supervisor in the cluster (workloads/run_supervisor.py): resubmits a run that lost a
node, bounds retries of one that fails by itself, stops it at its budget, and releases the GPU
workers when the run is over. See manifests.supervisor for its objects and rights.

Pass the cluster's Kubernetes provider in `opts.providers`. The GrpoJob should depend on this
component: after a spec change the supervisor restarts with the new spec first, and brings back
the RayCluster an earlier run's end suspended, so the job provider's readiness gate can pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_kubernetes as k8s
from pulumi_gcp import storage as gcs

from components.children import child_options
from components.gcs_fuse_storage import BUCKET_ROLE, ksa_principal
from domain.bucket import LOGS_DIR
from manifests import supervisor
from manifests.ray_cluster import DASHBOARD_PORT, head_service_name
from workloads import export_model, kube, run_lease, run_lifecycle, run_logs, run_record, run_supervisor
from workloads import gcs as gcs_json


class LogWriter(TypedDict):
    """The bucket whose managed folder `logs/` the supervisor writes the runs' logs into (workloads/run_logs.py)."""

    bucket: pulumi.Input[str]
    """The bucket's name, once it and its managed folders exist (GcsFuseStorage)."""
    project: str
    project_number: pulumi.Input[str]


class RunSupervisorArgs(TypedDict):
    namespace: str
    ray_cluster: str
    """The RayCluster's name; its head service is `<name>-head-svc`."""
    config: dict[str, Any]
    """SupervisorConfig's fields but head_url (the head service, filled in here)."""
    ray_token_secret: NotRequired[str | None]
    """The Secret with the Ray cluster's token, where its Ray has token authentication."""
    log_writer: NotRequired[LogWriter | None]
    """Grant its service account objectUser on the bucket's `logs/` managed folder (its Workload Identity,
    by the account's UID, as the Ray pods' grants)."""


class RunSupervisor(pulumi.ComponentResource):
    """Program and config ConfigMap, service account, Role, the admission policies and their bindings
    that hold its RayCluster writes to spec.suspend and its ConfigMap writes to run records,
    RoleBinding (after the policies), Deployment. It decides for the cluster's runs while it holds
    their Lease (docs/run-lifecycle.md)."""

    labels: dict[str, str]
    """What the Ray NetworkPolicy must admit to the head's Job API."""

    def __init__(self, name: str, args: RunSupervisorArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:RunSupervisor", name, {}, opts)
        child = child_options(self, opts)
        head_url = f"http://{head_service_name(args['ray_cluster'])}.{args['namespace']}.svc.cluster.local:{DASHBOARD_PORT}"
        config = {**args["config"], "head_url": head_url, "ray_token_secret": args.get("ray_token_secret") or ""}
        # Fails here, at preview, on a field the program does not take.
        run_supervisor.SupervisorConfig(**config)
        modules = {Path(m.__file__).name: Path(m.__file__).read_text()
                   for m in (run_supervisor, run_lifecycle, run_record, run_lease, run_logs, kube, export_model, gcs_json)}
        spec = supervisor.SupervisorSpec(namespace=args["namespace"], ray_cluster=args["ray_cluster"],
                                         programs=modules, config=config,
                                         ray_token_secret=args.get("ray_token_secret"))
        self.labels = dict(supervisor.LABELS)
        program = supervisor.program_config_map(spec)
        program_map = k8s.core.v1.ConfigMap(f"{name}-program", metadata=program["metadata"], data=program["data"],
                                            opts=child)
        account = supervisor.service_account(spec)
        service_account = k8s.core.v1.ServiceAccount(f"{name}-account", metadata=account["metadata"], opts=child)
        if writer := args.get("log_writer"):
            member = pulumi.Output.all(writer["project_number"], service_account.metadata["uid"]).apply(
                lambda v: ksa_principal(project_number=str(v[0]), project=writer["project"], uid=v[1]))
            gcs.ManagedFolderIamMember(f"{name}-log-writer", bucket=writer["bucket"], managed_folder=f"{LOGS_DIR}/",
                                       role=BUCKET_ROLE, member=member, opts=child)
        role = supervisor.role(spec)
        rules = k8s.rbac.v1.Role(f"{name}-role", metadata=role["metadata"], rules=role["rules"], opts=child)
        policy = supervisor.admission_policy(spec)
        admission = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-admission-policy", metadata=policy["metadata"], spec=policy["spec"], opts=child)
        policy_binding = supervisor.admission_policy_binding(spec)
        admission_binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-admission-binding", metadata=policy_binding["metadata"], spec=policy_binding["spec"],
            opts=child.merge(pulumi.ResourceOptions(depends_on=[admission])))
        record_policy = supervisor.record_admission_policy(spec)
        records = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-record-policy", metadata=record_policy["metadata"], spec=record_policy["spec"], opts=child)
        record_binding = supervisor.admission_policy_binding(spec, supervisor.record_policy_name(spec))
        records_bound = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-record-binding", metadata=record_binding["metadata"], spec=record_binding["spec"],
            opts=child.merge(pulumi.ResourceOptions(depends_on=[records])))
        binding = supervisor.role_binding(spec)
        # The rights only once both policies hold them to what they are for.
        grant = k8s.rbac.v1.RoleBinding(
            f"{name}-binding", metadata=binding["metadata"], role_ref=binding["roleRef"], subjects=binding["subjects"],
            opts=child.merge(pulumi.ResourceOptions(depends_on=[service_account, rules, admission_binding,
                                                                records_bound])))
        deployment = supervisor.deployment(spec)
        # Its pod starts with its program and its rights in place.
        k8s.apps.v1.Deployment(f"{name}-deployment", metadata=deployment["metadata"], spec=deployment["spec"],
                               opts=child.merge(pulumi.ResourceOptions(depends_on=[program_map, grant])))
        self.register_outputs({})


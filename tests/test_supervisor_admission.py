"""The admission policy that holds the run supervisor's RayCluster writes to spec.suspend: its
manifests against the real schemas, its CEL evaluated by a CEL implementation (cel-python) on
updates the supervisor makes and ones it must not."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
import yaml

from manifests import supervisor
from tests.k8s_schema import crd_paths, validate_core

SPEC = supervisor.SupervisorSpec(namespace="verl", ray_cluster="b200-ray-cluster",
                                 programs={f: "" for f in supervisor.PROGRAM_FILES}, config={})
SA = "system:serviceaccount:verl:b200-ray-cluster-supervisor"
CLUSTER: dict[str, Any] = {
    "apiVersion": "ray.io/v1", "kind": "RayCluster",
    "metadata": {"name": "b200-ray-cluster", "namespace": "verl", "resourceVersion": "7",
                 "labels": {"app": "verl"}, "annotations": {"a": "1"}},
    "spec": {"rayVersion": "2.49.0", "suspend": False,
             "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                 {"name": "ray-head", "image": "verlai/verl:x"}]}}},
             "workerGroupSpecs": [{"groupName": "gpu-workers", "replicas": 2, "minReplicas": 0, "maxReplicas": 2,
                                   "rayStartParams": {}, "template": {"spec": {"containers": [
                                       {"name": "ray-worker", "image": "verlai/verl:x"}]}}}]},
}


def _env() -> celpy.Environment:
    return celpy.Environment()


def _allowed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the policy's validations that fail for this update."""
    env = _env()
    activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
    return [v["message"] for v in supervisor.admission_policy(SPEC)["spec"]["validations"]
            if not env.program(env.compile(v["expression"])).evaluate(activation)]


def _matches(username: str) -> bool:
    (condition,) = supervisor.admission_policy(SPEC)["spec"]["matchConditions"]
    env = _env()
    return bool(env.program(env.compile(condition["expression"])).evaluate(
        {"request": celpy.json_to_cel({"userInfo": {"username": username}})}))


def _changed(change) -> dict[str, Any]:
    new = copy.deepcopy(CLUSTER)
    change(new)
    return new


def test_the_policy_and_its_binding_pass_the_kubernetes_schema():
    for version in ("1.30", "1.34"):
        validate_core(supervisor.admission_policy(SPEC), version)
        validate_core(supervisor.admission_policy_binding(SPEC), version)


def test_the_policy_is_the_stacks_own_and_binds_deny():
    policy, binding = supervisor.admission_policy(SPEC), supervisor.admission_policy_binding(SPEC)
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == "verl.b200-ray-cluster-supervisor"
    assert binding["spec"]["validationActions"] == ["Deny"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["ray.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                    "resources": ["rayclusters"], "resourceNames": ["b200-ray-cluster"]}
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "verl"}}


def test_the_spec_fields_checked_are_the_crds_but_suspend():
    (path,) = [p for p in crd_paths() if p.name.endswith("ray.io_rayclusters.yaml")]
    crd = yaml.safe_load(path.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    fields = set(v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    assert set(supervisor.RAY_CLUSTER_SPEC_FIELDS) == fields - {"suspend"}


@pytest.mark.parametrize("suspend", [True, False])
def test_the_supervisors_suspend_patch_is_allowed(suspend: bool):
    old = _changed(lambda c: c["spec"].update(suspend=not suspend))
    new = _changed(lambda c: (c["spec"].update(suspend=suspend), c["metadata"].update(resourceVersion="8")))
    assert _allowed(old, new) == []
    # suspend absent before (KubeRay's default) and set now
    old["spec"].pop("suspend")
    assert _allowed(old, new) == []


def _image(c):
    c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] = "evil:latest"


def _container(c):
    c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"].append(
        {"name": "x", "image": "evil", "securityContext": {"privileged": True}})


@pytest.mark.parametrize(("change", "field"), [
    (_image, "spec.workerGroupSpecs"),
    (lambda c: c["spec"]["workerGroupSpecs"][0].update(replicas=3), "spec.workerGroupSpecs"),
    (_container, "spec.workerGroupSpecs"),
    (lambda c: c["metadata"]["annotations"].update(a="2"), "metadata.annotations"),
    (lambda c: c["metadata"].pop("labels"), "metadata.labels"),
    (lambda c: c["metadata"].update(ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone",
                                                      "uid": "00000000-0000-0000-0000-000000000000"}]),
     "metadata.ownerReferences"),
    (lambda c: c["metadata"].update(finalizers=["example.com/never"]), "metadata.finalizers"),
    (lambda c: c["spec"]["headGroupSpec"]["template"]["spec"].update(hostNetwork=True), "spec.headGroupSpec"),
    (lambda c: c["spec"].update(enableInTreeAutoscaling=True), "spec.enableInTreeAutoscaling"),
    (lambda c: c["spec"].pop("rayVersion"), "spec.rayVersion"),
])
def test_any_other_change_is_denied(change, field: str):
    new = _changed(change)
    new["spec"]["suspend"] = True
    assert _allowed(CLUSTER, new) == [f"the run supervisor may change only spec.suspend, not {field}"]


def test_the_policy_applies_to_the_supervisor_only():
    assert _matches(SA)
    assert not _matches("system:serviceaccount:verl:other")
    assert not _matches("system:serviceaccount:other-ns:b200-ray-cluster-supervisor")
    assert not _matches("system:serviceaccount:kuberay:kuberay-operator")


RECORD = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "b200-ray-cluster-run-0123456789ab", "namespace": "verl",
                       "labels": {"app.kubernetes.io/component": "run-record",
                                  "verl-gke/ray-cluster": "b200-ray-cluster"}},
          "data": {"record.json": "{}"}}


def _record_denials(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    env = _env()
    activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
    return [v["message"] for v in supervisor.record_admission_policy(SPEC)["spec"]["validations"]
            if not env.program(env.compile(v["expression"])).evaluate(activation)]


def test_the_record_policy_and_its_binding_pass_the_kubernetes_schema():
    for version in ("1.30", "1.34"):
        validate_core(supervisor.record_admission_policy(SPEC), version)
        validate_core(supervisor.admission_policy_binding(SPEC, supervisor.record_policy_name(SPEC)), version)


def test_the_supervisor_may_create_update_and_delete_its_clusters_run_records():
    changed = copy.deepcopy(RECORD)
    changed["data"]["record.json"] = '{"run_id": "r"}'
    assert _record_denials(None, RECORD) == []  # create
    assert _record_denials(RECORD, changed) == []  # update
    assert _record_denials(RECORD, None) == []  # delete


@pytest.mark.parametrize("target", [
    {"metadata": {"name": "b200-ray-cluster-supervisor", "labels": {"app.kubernetes.io/component": "run-supervisor"}}},
    {"metadata": {"name": "b200-ray-cluster-run-0123456789ab",
                  "labels": {"app.kubernetes.io/component": "run-record", "verl-gke/ray-cluster": "other"}}},
    {"metadata": {"name": "hf-token-settings", "labels": {"app.kubernetes.io/component": "run-record",
                                                          "verl-gke/ray-cluster": "b200-ray-cluster"}}},
    {"metadata": {"name": "b200-ray-cluster-run-0123456789ab"}},
])
def test_no_other_configmap_can_be_written_by_it(target):
    program = {"apiVersion": "v1", "kind": "ConfigMap", **target, "data": {"run_supervisor.py": "evil"}}
    denied = {"the run supervisor may write only run record ConfigMaps of its RayCluster",
              "the run supervisor may change or delete only run record ConfigMaps of its RayCluster"}
    assert set(_record_denials(None, program)) == {sorted(denied)[1]}  # create
    assert set(_record_denials(program, program)) == denied  # update
    assert set(_record_denials(program, None)) == {sorted(denied)[0]}  # delete
    # Relabelling its own program as a record is an update of a non-record: denied.
    assert _record_denials(program, {**RECORD, "metadata": {**RECORD["metadata"], "name": program["metadata"]["name"]}})


def test_the_only_lease_the_supervisor_may_create_is_its_own():
    """Why 6: RBAC's resourceNames does not limit create (Kubernetes docs, "Using RBAC Authorization",
    Referring to resources), so the Role lets the supervisor create a Lease of any name; the policy
    admits its own Lease only."""
    rules = supervisor.record_admission_policy(SPEC)["spec"]["matchConstraints"]["resourceRules"]
    assert {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"], "resources": ["leases"],
            "operations": ["CREATE"]} in rules
    own = supervisor.lease_name(SPEC.ray_cluster)

    def lease(name: str) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": "verl"},
                "spec": {"holderIdentity": "x"}}

    assert _record_denials(None, lease(own)) == []
    assert _record_denials(None, lease("another-cluster-lease")) == [f"the run supervisor may create only its Lease {own}"]

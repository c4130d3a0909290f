"""refresh, replace and destroy on a live stack: the program's real resource options and provider
configuration, as the mock engine receives them, read against what the engine and the providers do
with them (sources below; docs/pulumi-lifecycle.md cites the same)."""

# - Pulumi engine, pkg/resource/deploy: step_generator.go (`continueStepsFromDiff`: delete-before-replace
#   deletes `calculateDependentReplacements` + `findDependentCascadeReplacements` first, cascades before
#   every other dependent; `diff`: a resource whose `replaceWith` names a replaced resource is replaced),
#   step.go (`DeleteStep.Apply` refuses a protected resource before its preview/delete branches;
#   `UpdateStep.Apply` keeps the ID in previews), pkg/backend/apply.go (`PreviewThenPromptThenExecute`:
#   a failed preview stops the operation). The stored engine is the snapshot whose sdk/.version is
#   3.260.0; the pinned 3.272 engine is not stored here, the installed Python SDK is 3.272.0.
# - pulumi-kubernetes provider/pkg/provider/provider.go (`DiffConfig`, `Configure`, `Read`, `Delete`,
#   `Diff`: delete first only for the same name and namespace), diff.go (`forceNew`), helm_release.go
#   (`Diff`: DeleteBeforeReplace false), provider/pkg/await/await.go (`Deletion`: waits until gone) and
#   provider/pkg/metadata/overrides.go (`DeletionPropagation`: Foreground) at the newest stored snapshot
#   (after v4.32.0; v4.34.2's tree is not stored); the installed 4.34.2 Python SDK's provider.py.
# - KubeRay v1.6.2 ray-operator/controllers/ray/raycluster_controller.go (`calculateStatus`; pods owned
#   through `controllerutil.SetControllerReference`; pods recreated for a new template only with
#   `upgradeStrategy: Recreate`).

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pulumi_kubernetes
import pytest
import yaml

from components.grpo_job import GrpoJobProvider
from tests.mock_run import OptionsMonitor
from verl_gke import synth

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "pulumi-lifecycle.md"

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
K8S_PROVIDER = "pulumi:providers:kubernetes"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
BUCKET = "gcp:storage/bucket:Bucket"


def _run(stack: str, overrides: dict[str, Any] | None = None, preview: bool = False,
         mocks: synth.SynthMocks | None = None) -> tuple[synth.SynthResult, OptionsMonitor]:
    monitor = OptionsMonitor(mocks or synth.SynthMocks())
    return synth.run(stack, overrides=overrides, preview=preview, monitor=monitor), monitor


_RUNS: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[synth.SynthResult, OptionsMonitor]] = {}


def _deployed(stack: str, **overrides: Any) -> tuple[synth.SynthResult, OptionsMonitor]:
    """One run per stack and config for the module (the program reads no environment here)."""
    key = (stack, tuple(sorted(overrides.items())))
    if key not in _RUNS:
        _RUNS[key] = _run(stack, {f"verl-gke:{k}": v for k, v in overrides.items()})
    return _RUNS[key]


@pytest.fixture(scope="module")
def standard() -> tuple[synth.SynthResult, OptionsMonitor]:
    return _deployed("a4-standard")


def engine_urn(urn: str, stack: str) -> str:
    """The URN the engine gives, as the docs write it: `<stack>` for the stack, and no root stack
    type in the type chain (sdk/go/common/resource/urn/urn.go `New`; the mock monitor keeps it)."""
    return urn.replace(f"urn:pulumi:{stack}::", "urn:pulumi:<stack>::").replace("pulumi:pulumi:Stack$", "")


def _by_urn(result: synth.SynthResult, urn: str) -> synth.Registration:
    return next(r for r in result.registrations if r.urn == urn)


def _one(result: synth.SynthResult, type_: str, name: str | None = None) -> synth.Registration:
    (found,) = [r for r in result.registrations if r.type == type_ and (name is None or r.name == name)]
    return found


# 1. refresh on an unreachable cluster -------------------------------------------------------------

def test_a_refresh_that_cannot_reach_the_cluster_forgets_nothing(standard) -> None:
    """provider.go `Read`: unreachable + deleteUnreachable answers every object (Helm releases too)
    as deleted. `Configure`: a key present among the provider's inputs overrides the environment, so
    leaving it out is what lets `PULUMI_K8S_DELETE_UNREACHABLE=true` switch it on for one command."""
    result, _ = standard
    provider = _one(result, K8S_PROVIDER)
    assert "deleteUnreachable" not in provider.inputs
    # Create-time adoption stays off: with it, a create-before-delete of a fixed name would adopt the
    # object the old resource's delete then removes (the option's description in provider.py).
    assert "upsertExistingObjects" not in provider.inputs


def test_delete_unreachable_in_the_environment_of_a_program_run_is_named(monkeypatch) -> None:
    """The installed SDK's provider.py reads PULUMI_K8S_DELETE_UNREACHABLE into the provider's inputs
    at `up`/`preview`, so the stack's state would keep it until an `up` without it."""
    source = Path(pulumi_kubernetes.__file__).with_name("provider.py").read_text()
    assert "get_env_bool('PULUMI_K8S_DELETE_UNREACHABLE')" in source
    monkeypatch.setenv("PULUMI_K8S_DELETE_UNREACHABLE", "true")
    result, _ = _run("a4")
    assert _one(result, K8S_PROVIDER).inputs["deleteUnreachable"] == "true"
    assert any(line.startswith("warning: PULUMI_K8S_DELETE_UNREACHABLE=true") and "pulumi up" in line
               for line in result.log), result.log


# 6. the Kubernetes provider's identity -----------------------------------------------------------

def _active_cluster(kubeconfig: str) -> dict[str, Any]:
    config = yaml.safe_load(kubeconfig)
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    return next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])


def diff_config(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """The keys pulumi-kubernetes' `DiffConfig` replaces the provider on (provider.go): an updated
    clusterIdentifier replaces; one present and unchanged replaces nothing; otherwise an unknown
    kubeconfig, or another active cluster (server, CA) in it, replaces."""
    unknown = synth.UNKNOWN
    if olds == news:
        return []
    replaces = []
    identifier = "clusterIdentifier"
    if identifier in olds and identifier in news and olds[identifier] != news[identifier]:
        replaces.append(identifier)
    same_identifier = identifier in news and olds.get(identifier) == news[identifier] and news[identifier] != unknown
    if news.get("kubeconfig") == unknown:
        replaces.append("kubeconfig")
    elif _active_cluster(olds["kubeconfig"]) != _active_cluster(news["kubeconfig"]):
        replaces.append("kubeconfig")
    return [] if same_identifier else replaces


def _provider_inputs(monitor: OptionsMonitor, result: synth.SynthResult) -> dict[str, Any]:
    provider = _one(result, K8S_PROVIDER)
    raw = monitor.sent[provider.name].raw_inputs
    return {key: synth.wire_to_json(value["value"] if synth._is_secret(value) else value)
            for key, value in raw.items()}


def test_the_kubernetes_provider_is_identified_by_its_cluster_not_by_how_it_is_reached(standard) -> None:
    """Switching `controlPlaneEndpoint` (or a CA rotation) changes the kubeconfig's server: without a
    clusterIdentifier DiffConfig replaces the provider and with it every object on the same cluster,
    whose fixed names then fail with AlreadyExists."""
    result, monitor = standard
    dns = _provider_inputs(monitor, result)
    ip_result, ip_monitor = _deployed("a4-standard", controlPlaneEndpoint="ip")
    ip = _provider_inputs(ip_monitor, ip_result)
    cluster = _one(result, CLUSTER)
    assert dns["clusterIdentifier"] == ip["clusterIdentifier"] == f"{cluster.name}-id"  # the cluster's id
    assert _active_cluster(dns["kubeconfig"]) != _active_cluster(ip["kubeconfig"])
    assert diff_config(dns, ip) == []
    # The stand-in sees what the identifier prevents.
    assert diff_config({k: v for k, v in dns.items() if k != "clusterIdentifier"},
                       {k: v for k, v in ip.items() if k != "clusterIdentifier"}) == ["kubeconfig"]


class _UpdatePreviewMocks(synth.SynthMocks):
    """A preview of an in-place update of the cluster: the engine keeps the id (step.go
    `UpdateStep.Apply`), the provider reports the endpoints it may change as unknown."""

    def new_resource(self, args):  # noqa: ANN001, ANN201 - the mocks' signature
        id_, state = super().new_resource(args)
        if args.typ == CLUSTER:
            return f"{args.name}-id", state
        return id_, state


def test_a_kubeconfig_unknown_at_preview_keeps_the_provider(standard) -> None:
    result, monitor = standard
    deployed = _provider_inputs(monitor, result)
    preview, preview_monitor = _run("a4-standard", preview=True, mocks=_UpdatePreviewMocks())
    planned = _provider_inputs(preview_monitor, preview)
    assert planned["kubeconfig"] == synth.UNKNOWN and planned["clusterIdentifier"] == deployed["clusterIdentifier"]
    assert diff_config(deployed, planned) == []


def test_an_existing_cluster_is_identified_by_its_path() -> None:
    from domain.config import load_config
    from domain.stack_files import raw_config

    cfg = load_config(raw_config("a4-standard", overrides={"verl-gke:existingCluster": True})[0])
    result, monitor = _deployed("a4-standard", existingCluster=True)
    assert _provider_inputs(monitor, result)["clusterIdentifier"] == (
        f"projects/{cfg.project}/locations/{cfg.cluster_location}/clusters/{cfg.cluster_name}")


def _built_in(type_: str) -> bool:
    """A Kubernetes kind of the API server itself: the core group or a `*.k8s.io` one."""
    group = type_.split(":")[1].rsplit("/", 1)[0]
    return "." not in group or group.endswith(".k8s.io")


def test_fixed_name_custom_objects_and_helm_releases_are_deleted_before_they_are_replaced() -> None:
    """A replacement the object's own diff does not decide (a replaced provider, `up --replace`)
    creates first. Built-in kinds: the provider's `Diff` deletes a same-named object first; custom
    resources go through the same `Diff`, Helm releases through helm_release.go's, which never does."""
    for stack in ("a4-standard", "a4x"):
        result, monitor = _deployed(stack)
        fixed = [r for r in result.registrations if r.custom and r.type.startswith("kubernetes:")
                 and not _built_in(r.type)]
        assert {r.type for r in fixed} >= ({HELM_RELEASE, RAY_CLUSTER} if stack == "a4x" else {RAY_CLUSTER})
        assert [r.urn for r in fixed if monitor.sent[r.name].delete_before_replace is not True] == []


# 3. how the head is reached ------------------------------------------------------------------------

@pytest.mark.parametrize("key,old,new", [
    ("dashboard_url", None, "http://10.0.0.7:8265"),
    ("dashboard_url", "http://10.0.0.7:8265", None),
    ("cluster_endpoint", "34.1.2.3", "gke-0123.us-central1.gke.goog"),
    ("cluster_ca_certificate", "Q0Ex", "Q0Ey"),
])
def test_how_the_head_is_reached_updates_the_run_in_place(standard, key, old, new) -> None:
    result, _ = standard
    job = synth.engine_numbers({k: v for k, v in _one(result, synth.GRPO_JOB_TYPE).inputs.items()})
    olds, news = {**job, key: old}, {**job, key: new}
    diff = GrpoJobProvider().diff("id", olds, news)
    assert (diff.changes, diff.replaces) == (True, [])


def test_an_update_gives_read_and_delete_the_new_way_to_the_head(standard) -> None:
    result, _ = standard
    job = synth.engine_numbers(_one(result, synth.GRPO_JOB_TYPE).inputs)
    olds = {**job, "submission_id": "verl-grpo-a4-standard-0123456789ab", "status": "RUNNING",
            "fabric_busbw_gbps": 312.5}
    news = {**job, "dashboard_url": "http://10.0.0.7:8265", "cluster_endpoint": "34.9.9.9"}
    outs = GrpoJobProvider().update("id", olds, news).outs
    assert (outs["dashboard_url"], outs["cluster_endpoint"]) == ("http://10.0.0.7:8265", "34.9.9.9")
    assert (outs["submission_id"], outs["status"], outs["fabric_busbw_gbps"]) == (
        "verl-grpo-a4-standard-0123456789ab", "RUNNING", 312.5)


# 4. deletion protection -------------------------------------------------------------------------

@pytest.mark.parametrize("protected", [True, False])
def test_deletion_protection_protects_the_cluster_in_pulumi_too(protected) -> None:
    """GKE checks deletionProtection only when the cluster itself is deleted, last; the engine
    refuses a protected resource's delete in `DeleteStep.Apply`, which a destroy's preview runs
    too, and a failed preview stops the destroy before any delete."""
    result, monitor = _deployed("a4-standard", **({"deletionProtection": True} if protected else {}))
    cluster = _one(result, CLUSTER)
    assert cluster.inputs["deletionProtection"] is protected
    assert monitor.sent[cluster.name].protect is protected


def test_the_docs_turn_protection_off_on_the_cluster_alone(standard) -> None:
    result, _ = standard
    urn = engine_urn(_one(result, CLUSTER).urn, "a4-standard")
    text = DOCS.read_text()
    assert "pulumi config set verl-gke:deletionProtection false" in text
    assert f"pulumi up --target '{urn}'" in text


# 5. what the run runs on ------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["a4-standard", "a4x"])
def test_the_run_is_replaced_with_what_it_runs_on_and_stopped_first(stack) -> None:
    """`diff`: a resource whose replaceWith names a replaced resource is replaced (so the preview
    shows the run's replacement); `continueStepsFromDiff`: a delete-before-replace of that resource
    deletes its cascades (replaceWith, deletedWith) before every other dependent and before it, in
    no set order among themselves, so the run must be the only one."""
    result, monitor = _deployed(stack)
    job = _one(result, synth.GRPO_JOB_TYPE)
    roots = [_one(result, CLUSTER).urn, _one(result, RAY_CLUSTER).urn,
             *[r.urn for r in result.registrations if r.type == NODE_POOL and "cpu-pool" not in r.name]]
    assert len(roots) >= 3
    assert monitor.sent[job.name].replace_with == sorted(roots)
    for root in roots:
        assert monitor.sent[_by_urn(result, root).name].delete_before_replace is True, root
        cascades = [name for name, sent in monitor.sent.items() if root in sent.replace_with or sent.deleted_with == root]
        assert cascades == [job.name], root
    # The new run waits for the new pools (through the RayCluster): it resumes on them.
    waits = set(job.dependencies)
    seen: set[str] = set()
    while waits - seen:
        urn = (waits - seen).pop()
        seen.add(urn)
        waits |= set(next((r.dependencies for r in result.registrations if r.urn == urn), []))
    assert set(roots) - {_one(result, CLUSTER).urn} <= seen


# 7. the bucket's volume ------------------------------------------------------------------------

PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
OTHER_BUCKET = "verl-gke-other-bucket"

# pulumi-kubernetes provider/pkg/provider/diff.go `forceNew`, for the kinds that hold or mount the
# bucket; every kind also replaces on metadata.name and metadata.namespace, a custom resource on
# nothing else.
FORCE_NEW = {
    PV: ("spec.csi",),
    PVC: ("spec.accessModes", "spec.selector", "spec.storageClassName", "spec.volumeName"),
    "kubernetes:batch/v1:Job": ("spec.completions", "spec.parallelism", "spec.selector", "spec.template"),
}


def _at(obj: Any, path: str) -> Any:
    for key in path.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def provider_diff(type_: str, olds: dict[str, Any], news: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(changes, replaces, delete_before_replace) as provider.go `Diff` decides them: a change under a
    force-new path replaces, and a replacement deletes first when the name and namespace stay."""
    paths = ("metadata.name", "metadata.namespace", *FORCE_NEW.get(type_, ()))
    replaces = any(_at(olds, p) != _at(news, p) for p in paths)
    same_name = all(_at(olds, p) == _at(news, p) for p in ("metadata.name", "metadata.namespace"))
    return olds != news, replaces, replaces and same_name


def plan(old: list[synth.Registration], new: synth.SynthResult, monitor: OptionsMonitor) -> dict[str, str]:
    """The step the engine takes for each Kubernetes object and the run, walking the registrations in
    order (step_generator.go `diff`: a resource whose replaceWith names a replaced one is replaced,
    before any provider diff; `continueStepsFromDiff`: the goal's deleteBeforeReplace, when set,
    overrides the provider's choice; a create-first replacement deletes the old object at the end of
    the `up`, `GenerateDeletes`). The run's diff is its provider's own."""
    olds = {r.urn: r for r in old}
    replaced: set[str] = set()
    steps: dict[str, str] = {}
    for r in new.registrations:
        if not r.custom or not (r.type.startswith("kubernetes:") or r.type == synth.GRPO_JOB_TYPE):
            continue
        before, sent = olds[r.urn].inputs, monitor.sent[r.name]
        if set(sent.replace_with) & replaced:
            changes, replaces, delete_first = True, True, False
        elif r.type == synth.GRPO_JOB_TYPE:
            diff = GrpoJobProvider().diff("id", synth.engine_numbers(before), synth.engine_numbers(r.inputs))
            changes, replaces, delete_first = diff.changes, bool(diff.replaces), bool(diff.delete_before_replace)
        else:
            changes, replaces, delete_first = provider_diff(r.type, before, r.inputs)
        if replaces:
            replaced.add(r.urn)
            delete_first = delete_first if sent.delete_before_replace is None else sent.delete_before_replace
            steps[r.name] = "delete, then create" if delete_first else "create, then delete at the end"
        elif changes:
            steps[r.name] = "update"
    return steps


def _claims(obj: Any) -> set[str]:
    """Every claim a manifest's pods mount (`persistentVolumeClaim.claimName` anywhere in it)."""
    if isinstance(obj, list):
        return set().union(*map(_claims, obj))
    if not isinstance(obj, dict):
        return set()
    found = {obj["persistentVolumeClaim"]["claimName"]} if "persistentVolumeClaim" in obj else set()
    return found.union(*map(_claims, obj.values()))


def unsafe(old: list[synth.Registration], new: synth.SynthResult, steps: dict[str, str]) -> list[str]:
    """What would fail or hang in the real `up`:
    - a create-first replacement under the same name and namespace: AlreadyExists (await.go `Creation`);
    - a volume or claim deleted first: a bound volume keeps kubernetes.io/pv-protection while its claim
      exists (Kubernetes' pv-protection controller: `isBeingUsed` is phase Bound), a claim keeps
      kubernetes.io/pvc-protection while a scheduled pod uses it, and the delete waits until it is gone
      (await.go `Deletion`, 10 minutes by default);
    - pods left on a claim the `up` deletes (an object that mounts it, not deleted first): that claim's
      delete at the end waits for them. KubeRay 1.6.2 recreates a RayCluster's pods for a new spec
      (`upgradeStrategy: Recreate`) only after the update returned, nothing awaits it, and deletes go
      Foreground (overrides.go `DeletionPropagation`), so only an object deleted first surely takes its
      pods with it."""
    olds = {r.urn: r for r in old}
    problems = []
    for r in new.registrations:
        step = steps.get(r.name)
        before = olds[r.urn].inputs
        if step == "create, then delete at the end" and all(
                _at(before, p) == _at(r.inputs, p) for p in ("metadata.name", "metadata.namespace")):
            problems.append(f"{r.name}: created beside itself under the same name")
        if step == "delete, then create" and r.type in (PV, PVC):
            problems.append(f"{r.name}: deleted first, while bound or mounted")
    gone = {_at(olds[r.urn].inputs, "metadata.name") for r in new.registrations
            if r.type == PVC and steps.get(r.name, "").startswith("create")}
    for r in new.registrations:
        if _claims(olds[r.urn].inputs) & gone and steps.get(r.name) != "delete, then create":
            problems.append(f"{r.name}: its pods stay on the claim the up deletes ({steps.get(r.name, 'same')})")
    return problems


# What a new bucket replaces, and how, on every stack.
BUCKET_CHANGE = {
    "storage-pv": "create, then delete at the end",
    "storage-pvc": "create, then delete at the end",
    "staging-job": "delete, then create",
    "ray-ray-cluster": "delete, then create",
    "grpo": "delete, then create",
}
# The supervisor copies the run's logs to the bucket its config names.
SUPERVISOR_ON_NEW_BUCKET = {"supervisor-program": "update", "supervisor-deployment": "update"}


@pytest.mark.parametrize("stack,key,value", [("a4-standard", "bucketName", OTHER_BUCKET),
                                             ("a4-standard", "volumeCapacity", "1Ti"),
                                             ("a4x", "bucketName", OTHER_BUCKET)])
def test_a_new_bucket_is_one_safe_up(stack, key, value) -> None:
    """The volume and its claim are created beside the old ones, under new names; whatever mounts the
    claim is deleted (its pods with it) and created on the new one; the old claim and volume go last."""
    old, _ = _deployed(stack)
    new, monitor = _deployed(stack, **{key: value})
    steps = plan(old.registrations, new, monitor)
    assert unsafe(old.registrations, new, steps) == []
    assert steps == BUCKET_CHANGE | (SUPERVISOR_ON_NEW_BUCKET if key == "bucketName" else {})


def _named_before(result: synth.SynthResult) -> list[synth.Registration]:
    """The registrations as verl-gke 0.5.1 made them: the same objects, with the tutorial's fixed names
    for the volume and its claim (`training-bucket-pv`, `training-bucket-pvc`)."""
    renames = {_one(result, PVC).inputs["metadata"]["name"]: "training-bucket-pvc",
               _one(result, PV).inputs["metadata"]["name"]: "training-bucket-pv"}

    def renamed(inputs: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(inputs)
        for new, old in renames.items():
            text = text.replace(f'"{new}"', f'"{old}"')
        return json.loads(text)

    return [dataclasses.replace(r, inputs=renamed(r.inputs)) for r in result.registrations]


@pytest.mark.parametrize("stack", ["a4-standard", "a4x"])
def test_the_first_up_after_fixed_names_renames_the_volume_and_restarts_the_run(stack) -> None:
    """The same bucket under the new names: the same steps as a new bucket (the run stopped, then
    resumed from its checkpoint on the same bucket), and nothing left waiting."""
    new, monitor = _deployed(stack)
    before = _named_before(new)
    assert {r.name: _claims(r.inputs) for r in before if _claims(r.inputs)} == {
        "ray-ray-cluster": {"training-bucket-pvc"}, "staging-job": {"training-bucket-pvc"}}
    steps = plan(before, new, monitor)
    assert unsafe(before, new, steps) == []
    assert steps == BUCKET_CHANGE


def test_replace_options_of_the_volume_the_claim_and_what_mounts_it(standard) -> None:
    result, monitor = standard
    pv, pvc = _one(result, PV), _one(result, PVC)
    claim = pvc.inputs["metadata"]["name"]
    assert pv.inputs["spec"]["claimRef"]["name"] == claim and pvc.inputs["spec"]["volumeName"] == pv.inputs[
        "metadata"]["name"]
    # No option: with a new name the provider's diff creates first; deleting first would wait on the finalizers.
    for volume in (pv, pvc):
        sent = monitor.sent[volume.name]
        assert (sent.delete_before_replace, sent.replace_on_changes, sent.replace_with) == (None, [], []), volume.name
    ray = _one(result, RAY_CLUSTER)
    assert monitor.sent[ray.name].replace_with == [pvc.urn]
    assert monitor.sent[ray.name].delete_before_replace is True
    mounting = [r for r in result.registrations if _claims(r.inputs)]
    assert sorted(r.name for r in mounting) == ["ray-ray-cluster", "staging-job"]
    for r in mounting:
        assert _claims(r.inputs) == {claim}, r.name
        assert pvc.urn in r.dependencies, r.name
    assert monitor.sent["staging-job"].delete_before_replace is True
    # The reclaim policy keeps what is in the bucket when the old volume goes.
    assert pv.inputs["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


# 8. destroy after the cluster was deleted out of band ------------------------------------------

def test_the_docs_give_destroy_after_an_out_of_band_delete_step_by_step(standard) -> None:
    result, _ = standard
    job = engine_urn(_one(result, synth.GRPO_JOB_TYPE).urn, "a4-standard")
    text = DOCS.read_text()
    section = text[text.index("### After the cluster was deleted out of band"):]
    commands = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n"))].splitlines()
    assert commands == ["PULUMI_K8S_DELETE_UNREACHABLE=true pulumi refresh", f"pulumi state delete '{job}'",
                        "pulumi destroy"]


# 9. the retained bucket, RayCluster readiness ------------------------------------------------------

@pytest.mark.parametrize("force_destroy", [False, True])
def test_a_forced_replacement_of_the_bucket_creates_first_so_it_is_never_forgotten(force_destroy) -> None:
    """A named bucket replaced delete-first would be forgotten (retained) or deleted (force_destroy)
    before its create fails with 409; created first, the create fails and the state keeps it. The
    option overrides the provider's choice (`continueStepsFromDiff`)."""
    result, monitor = _deployed("a4-standard", **({"bucketForceDestroy": True} if force_destroy else {}))
    bucket = _one(result, BUCKET)
    assert monitor.sent[bucket.name].delete_before_replace is False
    assert monitor.sent[bucket.name].retain_on_delete is (not force_destroy)


WAIT_FOR = "pulumi.com/waitFor"


def wait_for_satisfied(expression: str, obj: dict[str, Any]) -> bool:
    """pulumi-kubernetes' `jsonpath=` condition (provider/pkg/jsonpath/jsonpath.go `Parsed.Matches`):
    without `=value` the path must select something; with it, the first value must equal it."""
    match = re.fullmatch(r"jsonpath=\{\.([A-Za-z0-9_.]+)\}(?:=(.+))?", expression)
    assert match, expression
    value: Any = obj
    for key in match.group(1).split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return match.group(2) is None or str(value) == match.group(2)


# KubeRay v1.6.2 `calculateStatus`: `state` is set only to `ready` (every pod running) and to
# `suspended` (spec.suspend and no pod left); until the first is reached it is absent (omitempty).
PROVISIONING = {"status": {"desiredWorkerReplicas": 2, "readyWorkerReplicas": 0}}
READY = {"status": {"state": "ready", "readyWorkerReplicas": 2}}
SUSPENDED = {"spec": {"suspend": True}, "status": {"state": "suspended", "readyWorkerReplicas": 0}}
RESUMING = {"spec": {"suspend": False}, "status": {"state": "suspended", "readyWorkerReplicas": 0}}


@pytest.mark.parametrize("stack", ["a4-standard", "a4x"])
def test_the_ray_cluster_is_awaited_until_ready_and_never_on_a_suspended_one(stack) -> None:
    result, monitor = _deployed(stack)
    ray = _one(result, RAY_CLUSTER)
    expression = ray.inputs["metadata"]["annotations"][WAIT_FOR]
    assert not wait_for_satisfied(expression, PROVISIONING)
    assert wait_for_satisfied(expression, READY)
    # The run supervisor suspends a released cluster: an update then must not wait for pods that
    # come back only when the next run's create resumes it, after the update.
    assert wait_for_satisfied(expression, SUSPENDED) and wait_for_satisfied(expression, RESUMING)
    assert monitor.sent[ray.name].timeouts == ("60m", "60m")



def test_an_upgrade_rolls_the_ray_pods_onto_one_checkpoint_program(monkeypatch) -> None:
    """Issue 47 item 13. KubeRay 1.6.2 recreates a running cluster's pods for a new spec only with
    `upgradeStrategy: {type: Recreate}` (raycluster_controller.go `shouldRecreatePodsForUpgrade`: it
    compares a hash of the spec, replicas and workersToDelete left out, with the head pod's annotation, and
    deletes every pod on a mismatch); the CRD's enum is Recreate | None. Without it a new program changed
    the fixed-name ConfigMap under the running pods (kubelet refreshes a mounted ConfigMap), so copiers kept
    the old code while the next attempt's launcher ran the new one. Now the program's ConfigMap is named by
    its content and immutable: a running pod keeps its version, the new name changes every pod template,
    and Recreate rolls every pod onto it; the old ConfigMap is created-first-replaced, so it stays until the
    end of that `up`."""
    from components import ray_training_cluster
    from manifests import checkpoints

    def program_map(result: synth.SynthResult) -> dict[str, Any]:
        found, = [m for m in result.manifests() if m["kind"] == "ConfigMap"
                  and m["metadata"]["name"].startswith(checkpoints.CONFIG_MAP)]
        return found

    def cluster(result: synth.SynthResult) -> dict[str, Any]:
        return next(m for m in result.manifests() if m["kind"] == "RayCluster")

    old = _run("a4-standard")[0]
    text = ray_training_cluster.checkpoint_program()
    both = text + ray_training_cluster.checkpoint_client()  # the program and its GCS client, one ConfigMap
    assert program_map(old)["metadata"]["name"] == f"verl-gke-checkpoints-{hashlib.sha256(both.encode()).hexdigest()[:10]}"
    assert program_map(old)["immutable"] is True
    assert cluster(old)["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    monkeypatch.setattr(ray_training_cluster, "checkpoint_program", lambda: text + "\n# 0.7.1\n")
    new = _run("a4-standard")[0]
    olds, news = program_map(old), program_map(new)
    assert olds["metadata"]["name"] != news["metadata"]["name"]
    assert provider_diff("kubernetes:core/v1:ConfigMap", olds, news) == (True, True, False)  # created first
    spec = cluster(new)["spec"]
    for pod in (spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["checkpoint-program"]["configMap"]["name"] == news["metadata"]["name"]

"""Offline synth: run the real Pulumi program in-process under Pulumi's mock engine.

`python -m verl_gke.synth <stack>` writes dist/<stack>/: every resource the
program registers with its inputs as the engine would send them to the provider, every Kubernetes
object the program defines as YAML, and the stack outputs, secrets masked as "[secret]".
No Pulumi CLI, no plugins, no credentials and no network are involved.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import runpy
import shlex
import signal
import sys
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks, rpc, settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from domain import checkpoint_time, deploy_timing, measured, preflight, run_memory, run_time, verl_config
from domain.platforms import SMOKE_CANNOT_EXERCISE, SMOKE_PLATFORM, Duration, staging_duration
from domain.verl_config import verl_run_check
from components import pinned_image
from components.grpo_job import planned_outs
from domain.run_identity import whole_numbers
from verl_gke import image_pins, output_dir
from domain.stack_files import PROJECT_DIR, declared_types, raw_config, stack_names

PROJECT = "verl-gke"
SECRET = "[secret]"
UNKNOWN = deploy_timing.UNKNOWN
MOCK_PROJECT_NUMBER = "123456789012"


def mock_uid(kind: str, namespace: str, name: str) -> str:
    """The UID the API server would give a Kubernetes object: a UUID, here derived from the object."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"verl-gke-synth/{kind}/{namespace}/{name}"))
MOCK_CA = preflight.MOCK_CA
MOCK_ENDPOINT = preflight.MOCK_ENDPOINT
MOCK_DNS_ENDPOINT = preflight.MOCK_DNS_ENDPOINT

GRPO_JOB_TYPE = "pulumi-python:dynamic:GrpoJob"
PINNED_IMAGE_TYPE = "pulumi-python:dynamic:PinnedImage"
EXCLUSION_START_TYPE = "pulumi-python:dynamic:UpgradeExclusionStart"
UNRESOLVED_DIGEST = "[digest resolved at pulumi up]"
"""What synth puts where the registry's digest goes: no registry is asked offline, and none is made up."""
# Top-level fields of a Kubernetes object, in the order kubectl shows them.
_MANIFEST_FIELDS = ("apiVersion", "kind", "metadata", "type", "immutable", "data", "stringData", "spec",
                    "rules", "roleRef", "subjects")
# Remote components and providers are registered but are not objects the program "applies".
_NOT_MANIFESTS = ("kubernetes:helm.sh/", "kubernetes:yaml/", "pulumi:providers:")


def _is_secret(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get(rpc._special_sig_key) == rpc._special_secret_sig


def _masked(value: Any) -> Any:
    """A secret's shape with every leaf replaced: `{"hf_api_token": "[secret]"}` stays a valid map."""
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return SECRET


def wire_to_json(value: Any) -> Any:
    """A property value as the engine sees it -> plain JSON, secrets masked, unknowns marked."""
    if _is_secret(value):
        return _masked(value.get("value"))
    if isinstance(value, dict):
        sig = value.get(rpc._special_sig_key)
        if sig == rpc._special_resource_sig:
            return value.get("urn")
        if sig == rpc._special_output_value_sig:
            if value.get("secret"):
                return SECRET
            return wire_to_json(value["value"]) if "value" in value else UNKNOWN
        return {k: wire_to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [wire_to_json(v) for v in value]
    if value == rpc.UNKNOWN:
        return UNKNOWN
    return value


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    provider: str | None
    dependencies: list[str]
    inputs: dict[str, Any]


class _InlineExecutor(ThreadPoolExecutor):
    """Runs each submitted call at once, on the calling thread (asyncio only takes this class)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 handed to the awaiting coroutine
            future.set_exception(error)
        return future


def _resource_hash(resource: pulumi.Resource) -> int:
    """A resource's hash from its type and name, where Python's is its address. The SDK keeps
    resources in sets (a component's children, an Output's resources) and awaits their URNs in the
    set's order (pulumi runtime/rpc.py _add_dependency, _expand_dependencies): that order decides
    which of the resources ready at the same moment registers first, so with addresses it changed
    from run to run. Identity still decides equality. Kept on the resource once its type and name are
    set (never changed after): the SDK's cycle check hashes each resource thousands of times."""
    known = resource.__dict__.get(_HASH)
    if known is not None:
        return known
    value = zlib.crc32(f"{getattr(resource, '_type', '')}::{getattr(resource, '_name', '')}".encode())
    if hasattr(resource, "_type") and hasattr(resource, "_name"):
        resource.__dict__[_HASH] = value
    return value


_HASH = "_synth_hash"


class SynthMocks(pulumi.runtime.Mocks):
    """Plausible provider answers: inputs echoed back plus the computed fields the program reads.

    The preflight's invokes are answered from `cloud` (token -> the provider's answer, or a list of
    answers picked by the call's arguments, or `{"error": message}` for a failing invoke); the others
    by `healthy`, and recorded in `unchecked`: live checks this run could not make.
    """

    def __init__(self, cloud: Mapping[str, Any] | None = None,
                 healthy: Callable[[str, dict[str, Any]], dict[str, Any] | None] | None = None) -> None:
        super().__init__()
        self.cloud = dict(cloud or {})
        self.healthy = healthy
        self.unchecked: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        id_, state = self._created(args)
        if pulumi.runtime.is_dry_run():
            # A first preview creates nothing: the provider answers a new resource with its inputs,
            # every computed output unknown (endpoint, CA, email, the job's id), and no id.
            return "", _computed_unknown(dict(args.inputs), state)
        return id_, state

    def _created(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        state = dict(args.inputs)
        name = state.get("name") or args.name
        if args.typ == "gcp:container/cluster:Cluster":
            # pulumi-gcp marks the client key and certificate secret; the Python SDK then marks the
            # whole masterAuth object secret (pulumi/runtime/rpc.py), the CA with it.
            given = (state.get("controlPlaneEndpointsConfig") or {}).get("dnsEndpointConfig") or {}
            state["controlPlaneEndpointsConfig"] = preflight.mock_endpoints_config(
                bool(given.get("allowExternalTraffic")))
            state.update(endpoint=MOCK_ENDPOINT, masterAuth={
                "clusterCaCertificate": MOCK_CA, "clientKey": _secret(""), "clientCertificate": _secret(""),
                "clientCertificateConfig": {"issueClientCertificate": False}})
        elif args.typ == "gcp:serviceaccount/account:Account":
            state["email"] = f"{state['accountId']}@{state['project']}.iam.gserviceaccount.com"
        elif args.typ == "gcp:storage/bucket:Bucket":
            state.update(url=f"gs://{name}", projectNumber=int(MOCK_PROJECT_NUMBER))
        elif args.typ.startswith("gcp:compute/"):
            state["selfLink"] = f"https://www.googleapis.com/compute/v1/projects/mock/{name}"
        elif args.typ.startswith("kubernetes:") and isinstance(state.get("metadata"), dict):
            meta = {"name": args.name, **state["metadata"]}
            state["metadata"] = {**meta, "uid": mock_uid(args.typ.rsplit(":", 1)[-1], meta.get("namespace", ""),
                                                          meta["name"])}
        elif args.typ == GRPO_JOB_TYPE:
            # The provider gets every number as a float (a protobuf Struct has no integers). The
            # submission id and dashboard command are known offline; the run's status is not.
            state = planned_outs(engine_numbers(state), UNKNOWN)
            return state["submission_id"], state
        elif args.typ == PINNED_IMAGE_TYPE:
            state = pinned_image.outs(state["image"], UNRESOLVED_DIGEST)
            return state["ref"], state
        elif args.typ == EXCLUSION_START_TYPE:
            # Read from the clock at the first `pulumi up`: offline there is none, and none is made up.
            return f"{state['cluster']}@first-up", {**state, "start": rpc.UNKNOWN}
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]]]:
        """The invoke's result, and the provider's failure if the answer is one."""
        if args.token in preflight.CHECKS:
            answer = _pick(self.cloud[args.token], args.args) if args.token in self.cloud else None
            if args.token not in self.cloud:
                if args.token not in self.unchecked:
                    self.unchecked.append(args.token)
                answer = self.healthy(args.token, dict(args.args)) if self.healthy else None
                if answer is None and args.token == preflight.CLUSTER:
                    answer = preflight.existing_cluster_answer(args.args)
            if isinstance(answer, dict) and set(answer) == {"error"}:
                return {}, [("", str(answer["error"]))]
            if args.token == preflight.CLUSTER and isinstance(answer, dict):
                # The lookup's masterAuths carry the secret client key too (pulumi-gcp's schema).
                answer = {**answer, "masterAuths": [{**auth, "clientKey": _secret("")} if isinstance(auth, dict)
                                                    else auth for auth in answer.get("masterAuths") or []]}
            return dict(answer or {}), []
        if args.token == "gcp:organizations/getProject:getProject":
            return {"number": MOCK_PROJECT_NUMBER, "projectId": args.args.get("projectId", "mock")}, []
        return {}, []


def _computed_unknown(inputs: Any, state: Any) -> Any:
    """`state` with every value the provider computed (absent from or unlike `inputs`) unknown."""
    if isinstance(state, dict) and not _is_secret(state):
        given = inputs if isinstance(inputs, dict) else {}
        return {k: _computed_unknown(given.get(k), v) if k in given else rpc.UNKNOWN for k, v in state.items()}
    return state if state == inputs else rpc.UNKNOWN


def _secret(value: Any) -> dict[str, Any]:
    """A provider output marked secret, as it crosses the wire."""
    return {rpc._special_sig_key: rpc._special_secret_sig, "value": value}


def engine_numbers(value: Any) -> Any:
    """Every number as the engine hands it to a dynamic provider: a float."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, Mapping):
        return {key: engine_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [engine_numbers(item) for item in value]
    return value


def _pick(answer: Any, args: Mapping[str, Any]) -> Any:
    """One answer for every call, or from a list the first whose fields agree with the call's args
    (a field may be the resource's URL: `.../zones/us-central1-b` agrees with `us-central1-b`)."""
    if not isinstance(answer, list):
        return answer

    def agrees(candidate: Mapping[str, Any]) -> bool:
        return all(k not in candidate or candidate[k] == v or str(candidate[k]).endswith(f"/{v}")
                   for k, v in args.items())

    return next((c for c in answer if isinstance(c, dict) and agrees(c)), None)


class RecordingMonitor(mocks.MockMonitor):
    """The stock mock monitor, plus a record of every register request in order."""

    def __init__(self, mocks_: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks_)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            deps = set(request.dependencies)
            for prop_deps in request.propertyDependencies.values():
                deps.update(prop_deps.urns)
            inputs = json_format.MessageToDict(request.object, preserving_proto_field_name=True)
            self.registrations.append(Registration(
                urn=response.urn, type=request.type, name=request.name,
                parent=request.parent or None, custom=bool(request.custom),
                provider=request.provider.rsplit("::", 1)[0] if request.provider else None,
                dependencies=sorted(deps), inputs=wire_to_json(inputs)))
        return response


@dataclass
class SynthResult:
    stack: str
    registrations: list[Registration]
    outputs: dict[str, Any]
    placeholders: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    """What the program logged (the GRPO run's plan, warnings)."""
    unchecked: list[str] = field(default_factory=list)
    """Invoke tokens of live checks answered by the healthy stand-in, not by `--cloud`."""
    modeled: list[str] = field(default_factory=list)
    """What synth models of the run: GPU memory per GPU, the deploy's critical path."""
    images: list[str] = field(default_factory=list)
    """Where each image's digest comes from: the repository, or the first `pulumi up` (verl_gke.image_pins)."""

    def manifests(self) -> list[dict[str, Any]]:
        """Kubernetes objects the program defines, in registration order, as they would be applied."""
        out = []
        for r in self.registrations:
            if r.type.startswith("kubernetes:") and not r.type.startswith(_NOT_MANIFESTS):
                # The Kubernetes provider applies the wire's 3.0 as 3.
                out.append(whole_numbers({k: r.inputs[k] for k in _MANIFEST_FIELDS if k in r.inputs}))
        return out


async def _resolve(value: Any) -> Any:
    """A stack output value -> JSON, secrets masked."""
    if isinstance(value, pulumi.Output):
        if await value.is_secret():
            return SECRET
        if not await value.is_known():
            return UNKNOWN
        return await _resolve(await value.future())
    if isinstance(value, dict):
        return {k: await _resolve(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [await _resolve(v) for v in value]
    return value


class _EngineLog(logging.Handler):
    """What the program logs through pulumi.log (info and up), as `pulumi up` would show it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        prefix = "warning: " if record.levelno >= logging.WARNING else ""
        self.lines.append(prefix + record.getMessage())


def run_in_mocks(program: Callable[[], Any], *, stack: str = "test", config: dict[str, str] | None = None,
                 secret_keys: list[str] | None = None, preview: bool = False,
                 monitor: RecordingMonitor | None = None,
                 log: list[str] | None = None) -> tuple[list[Registration], dict[str, Any]]:
    """Run `program` under a fresh mock engine; return its registrations and resolved stack outputs.

    `set_mocks` is process-global: each call resets the runtime first, so calls don't leak.
    Pass a `monitor` to inspect what was registered when the program raises, and a `log` list to
    collect what the program logs.
    """
    settings.reset_options(project=PROJECT, stack=stack, preview=preview)
    # RPCs run inline on the event loop's thread, not in a thread pool: the mock monitor then sees
    # registrations in the order the program issues them, the same on every run.
    _ensure_event_loop().set_default_executor(_InlineExecutor())
    # Registration order then depends on the program alone, not on memory addresses.
    pulumi.Resource.__hash__ = _resource_hash  # type: ignore[method-assign]
    set_all_config(dict(config or {}), list(secret_keys or []))
    synth_mocks = SynthMocks()
    monitor = monitor or RecordingMonitor(synth_mocks)
    engine_log = _EngineLog()
    logger = logging.getLogger(f"{__name__}.engine")
    logger.handlers[:] = [engine_log]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    pulumi.runtime.set_mocks(synth_mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor,
                             logger=logger)
    root = settings.get_root_resource()
    outputs: dict[str, Any] = {}

    async def body() -> None:
        program()

    async def resolve_all() -> None:
        for key, value in getattr(root, "outputs", {}).items():
            outputs[key] = await _resolve(value)

    try:
        _sync_await(run_pulumi_func(body))
        _sync_await(resolve_all())
    finally:
        if log is not None:
            log.extend(engine_log.lines)
    return monitor.registrations, outputs


def run(stack: str, project_dir: Path = PROJECT_DIR, overrides: dict[str, Any] | None = None,
        preview: bool = False, monitor: RecordingMonitor | None = None,
        cloud: Mapping[str, Any] | None = None) -> SynthResult:
    """Run __main__.py of `project_dir` for `stack` under mocks and return what it registered.
    `cloud` answers the live checks' invokes (see SynthMocks); the rest get healthy answers."""
    from domain.config import ConfigError, load_config, placeholders

    raw, secret_keys = raw_config(stack, project_dir, overrides)
    declared = declared_types(project_dir)
    try:
        checked = load_config(raw, declared=declared)  # frozen: the run's summary reads it too
        healthy = preflight.healthy_answers(checked)
    except ConfigError:
        checked = healthy = None  # the program reports the config's problems itself
    monitor = monitor or RecordingMonitor(SynthMocks(cloud, healthy))
    if isinstance(monitor.mocks, SynthMocks) and monitor.mocks.healthy is None:
        monitor.mocks.healthy = healthy  # a caller's own monitor gets the stand-in too
    log: list[str] = []
    registrations, outputs = run_in_mocks(
        lambda: runpy.run_path(str(project_dir / "__main__.py"), run_name="__main__"),
        stack=stack, config=raw, secret_keys=secret_keys, preview=preview, monitor=monitor, log=log)
    unchecked = list(getattr(monitor.mocks, "unchecked", []))
    cfg = checked if checked is not None else load_config(raw, declared=declared)
    _, plan = verl_run_check(cfg, measured.load(project_dir, stack))  # the program ran it: no problem left
    modeled = [run_memory.summary_line(cfg.verl, cfg.facts, cfg.model, cfg.gpu_nodes),
               *deploy_timing.model([r.__dict__ for r in registrations], staging_time(cfg.model)).lines(
                   plan.time if plan else None, cfg.hourly_usd)]
    if cfg.platform == SMOKE_PLATFORM:
        modeled.append(f"The smoke stack cannot exercise: {SMOKE_CANNOT_EXERCISE}.")
    return SynthResult(stack, registrations, outputs, placeholders(raw, cfg), log, unchecked, modeled,
                       image_pins.summary_lines(cfg))


def staging_time(model: str) -> Duration | None:
    """The staging Job's time for a model of the table (its bf16 safetensors); None: the 32B estimate."""
    shape = run_memory.MODELS.get(model)
    return staging_duration(2 * shape.params) if shape else None


def render(result: SynthResult) -> dict[str, str]:
    """dist/<stack>/'s files, path -> text: resources.json, outputs.json, manifests/NN-<kind>-<name>.yaml."""
    # Mapping keys sorted (the engine's protobuf maps come in any order), list order kept.
    resources = [{**r.__dict__, "inputs": _keys_sorted(r.inputs)} for r in result.registrations]
    files = {"resources.json": json.dumps(resources, indent=2) + "\n",
             "outputs.json": json.dumps(result.outputs, indent=2, sort_keys=True) + "\n"}
    for i, obj in enumerate(result.manifests(), start=1):
        kind = str(obj.get("kind", "object")).lower()
        name = str(obj.get("metadata", {}).get("name", "unnamed"))
        files[f"manifests/{i:02d}-{kind}-{name}.yaml"] = yaml.safe_dump(obj, sort_keys=True)
    return files


def _keys_sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _keys_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_keys_sorted(v) for v in value]
    return value


def write(result: SynthResult, out_dir: Path) -> None:
    """Write `result` to `out_dir`, replacing only an earlier synth's files (see output_dir)."""
    output_dir.replace(out_dir, render(result))


_CREATED = ((deploy_timing.CLUSTER, "GKE cluster", "GKE clusters"), (deploy_timing.NODE_POOL, "node pool", "node pools"),
            ("gcp:compute/network:Network", "VPC", "VPCs"), ("gcp:storage/bucket:Bucket", "bucket", "buckets"),
            (deploy_timing.RAY_CLUSTER, "RayCluster", "RayClusters"), (GRPO_JOB_TYPE, "GRPO job", "GRPO jobs"))
"""What the one-screen summary names of the resources; --verbose counts every type."""
_DETAILS = (checkpoint_time.LINE_START, run_time.ASSUMPTIONS, deploy_timing.CRITICAL_PATH)
"""Lines (after their indent) that only --verbose shows: how the figures above them were modeled."""


def _created(result: SynthResult) -> str:
    counts = Counter(r.type for r in result.registrations)
    named = [f"{counts[t]} {one if counts[t] == 1 else many}" for t, one, many in _CREATED if counts[t]]
    return (f"`pulumi up` would create {len(result.registrations)} resources: {', '.join(named)}, "
            f"{len(result.manifests())} Kubernetes objects in all; {len(result.outputs)} stack outputs")


def _brief(lines: list[str]) -> list[str]:
    """The program's log without its details: the modeling lines, and of the verl settings the user's alone."""
    out: list[str] = []
    settings: list[str] | None = None
    for line in lines:
        if line == verl_config.SETTINGS_HEADER:
            settings = []
            out.append(line)
            continue
        if settings is not None and line.startswith("  ") and line[2:3] in ("*", " "):
            settings.append(line)
            continue
        if settings is not None:
            out[-1:] = _settings_brief(settings)
            settings = None
        if not line.lstrip().startswith(tuple(d.strip() for d in _DETAILS)):
            out.append(line)
    if settings is not None:
        out[-1:] = _settings_brief(settings)
    return out


def _settings_brief(settings: list[str]) -> list[str]:
    given = [line for line in settings if line.startswith("  *")]
    return [f"verl settings: {len(settings)}, {len(given)} of them set in verl-gke:verl"
            + (":" if given else " (the platform's defaults; --verbose lists them)"), *given]


def summary(result: SynthResult, out_dir: Path, verbose: bool = False) -> str:
    """What synth prints: one screen (what is created, the run, its cost and time, what is still a
    placeholder, the checks not made); `verbose` adds how each figure was modeled and the full lists."""
    lines = [f"verl-gke synth: stack {result.stack}: {len(result.registrations)} resources -> {out_dir} "
             "(offline: nothing was created)"]
    if verbose:
        counts = Counter(r.type for r in result.registrations)
        lines += [f"  {n:3d}  {t}" for t, n in sorted(counts.items())]
        lines.append(f"  {len(result.manifests())} Kubernetes manifests, {len(result.outputs)} stack outputs")
        lines += result.log
        lines += result.modeled
    else:
        lines.append(_created(result))
        lines += _brief(result.log)
        lines += _brief(result.modeled)
    lines += result.images
    if result.unchecked:
        lines.append("Live checks not made (no --cloud answer; `pulumi preview` makes them):")
        lines += [f"  {preflight.CHECKS[token]} ({token})" for token in result.unchecked]
    if not verbose:
        lines.append("(--verbose: every resource type, every verl setting, the critical path, the models' assumptions)")
    if result.placeholders:
        lines.append("Set these before `pulumi up` (they still hold placeholders):")
        lines += [f"  {key}" for key in result.placeholders]
    else:
        lines.append("No placeholders left: ready for `pulumi up`.")
    return "\n".join(lines)


def read_cloud_answers(path: Path) -> dict[str, Any]:
    """`--cloud FILE`: a JSON object of invoke token -> answer; ValueError names what is wrong."""
    try:
        answers = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--cloud {path}: {error}") from None
    if not isinstance(answers, dict):
        raise ValueError(f"--cloud {path}: must be a JSON object of invoke token -> answer")
    for token, answer in answers.items():
        # The provider answers an invoke with an object; a list picks one per call; {"error": ...} fails it.
        if not (isinstance(answer, dict) or (isinstance(answer, list) and all(isinstance(a, dict) for a in answer))):
            raise ValueError(f"--cloud {path}: the answer to {token} must be a JSON object (the provider's "
                             f"answer) or a list of them, not {json.dumps(answer)[:60]}")
    unknown = sorted(set(answers) - set(preflight.CHECKS))
    if unknown:
        raise ValueError(f"--cloud {path}: no live check makes {', '.join(unknown)}; "
                         f"known: {', '.join(preflight.CHECKS)}")
    return answers


class _UsageError(Exception):
    """A wrong command line: one line, nothing tried."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a wrong command line is one line (no usage block), as the CLI's."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


_STACK_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
"""A Pulumi stack name (pulumi/pulumi sdk/go/common/tokens, ValidateStackName; no '/' outside an org path)."""


def _progress(stack: str, message: str) -> None:
    """What synth is doing, on stderr (stdout is the summary)."""
    print(f"synth: {stack}: {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """synth's command line; a wrong one raises _UsageError (one line)."""
    parser = _Parser(prog="synth", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", help="stack name, e.g. a4-standard (reads Pulumi.<stack>.yaml)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default dist/<stack>)")
    parser.add_argument("--cloud", type=Path, default=None, metavar="FILE",
                        help="JSON object: invoke token -> the provider's answer, for the live checks")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value for this synth only, e.g. verl-gke:gpuNodes=4")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also every resource type, every verl setting, the critical path and the models' assumptions")
    return parser


def _verl_path_advice(item: str) -> str:
    """What to give --set instead of a verl path (`pulumi config set --path` has paths; --set has keys)."""
    key, _, text = item.partition("=")
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = text
    nested: Any = value
    for part in reversed(key.removeprefix("verl-gke:verl.").split(".")):
        nested = {part: nested}
    whole = shlex.quote(f"verl-gke:verl={json.dumps(nested)}")
    return (f"--set {item}: --set takes whole keys, not verl paths: --set {whole} (it replaces the stack file's "
            f"verl-gke:verl for this synth), or `pulumi config set --path {key} {shlex.quote(text)}`")


def main(argv: list[str] | None = None) -> int:
    from domain.config import ConfigError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        bad = [item for item in args.set if "=" not in item or ":" not in item.split("=", 1)[0]]
        if bad:
            parser.error(f"--set takes NAMESPACE:KEY=VALUE, got {bad[0]!r}")
        if paths := [item for item in args.set if item.startswith("verl-gke:verl.")]:
            parser.error(_verl_path_advice(paths[0]))
    except _UsageError as error:
        print(f"synth failed: {error} (see synth --help)", file=sys.stderr)
        return 2
    out_dir = args.out or PROJECT_DIR / "dist" / args.stack
    overrides = dict(item.split("=", 1) for item in args.set)
    if not _STACK_NAME.match(args.stack) or args.stack in (".", ".."):
        print(f"synth failed: stack {args.stack!r}: a Pulumi stack name is letters, digits, '-', '_' or '.'; "
              f"stacks here: {', '.join(stack_names())}", file=sys.stderr)
        return 2
    try:
        output_dir.check(out_dir)
    except output_dir.OutputDirError as error:
        print(f"synth failed: {error}", file=sys.stderr)
        return 2
    try:
        cloud = read_cloud_answers(args.cloud) if args.cloud else None
    except ValueError as error:
        print(f"synth failed: {error}", file=sys.stderr)
        return 2
    _progress(args.stack, f"reading Pulumi.{args.stack}.yaml and running the program under Pulumi's mock engine "
                          "(offline: no cloud call, no credential)")
    try:
        result = run(args.stack, overrides=overrides, cloud=cloud)
    except (ConfigError, pulumi.RunError, FileNotFoundError, measured.MeasuredError) as error:
        output_dir.clear(out_dir)
        print(f"synth failed: {error}", file=sys.stderr)
        return 2
    files = render(result)
    _progress(args.stack, f"writing {len(files)} files to {out_dir}")
    try:
        output_dir.replace(out_dir, files)
    except (output_dir.OutputDirError, OSError) as error:
        reason = error if isinstance(error, output_dir.OutputDirError) else \
            f"--out {out_dir}: cannot write there ({error.strerror or error}: {error.filename or out_dir})"
        print(f"synth failed: {reason}", file=sys.stderr)
        return 2
    print(summary(result, out_dir, verbose=args.verbose))
    return 0


if __name__ == "__main__":
    # `synth ... | head` should end quietly, as other command-line tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())

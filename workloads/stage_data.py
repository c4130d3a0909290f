"""Stage the model and the dataset into the training bucket; runs inside the staging Job.

Writes to the bucket mount the model at a pinned commit, GSM8K or MATH in verl's row format (`gsm8k/*.parquet`)
and verl from its sha256-pinned wheel (`verl-<version>/`), each with a marker so a matching re-run does
nothing. The Hugging Face token is read from Secret Manager through Workload Identity, never from the
pod spec or Pulumi's state; wandb's key, when named, likewise, applied as the Kubernetes Secret only
the Ray containers read. Exit 0 done, 1 transient (the Job retries), 2 permanent; one line on failure.
Standard library, huggingface_hub and pyarrow (the last two imported where used).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from domain.staged import (  # shipped beside this script (domain/staged.py)
    DEFAULT_DATASET_REPO,
    DEFAULT_DATASET_REVISION,
    DEFAULT_MODEL_REPO,
    DEFAULT_MODEL_REVISION,
    MARKER_NAME,
    MATH_REPO,
    PERMANENT_HTTP_STATUS,
    RECIPES,
    WANDB_SECRET,
    WANDB_SECRET_KEY,
    StagingError,
    dataset_problem,
    is_repo_id,
    make_marker,
    model_dir_for,
    read_marker,
    recipe_for,
    stage_wheel,
    write_marker,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from workloads.gcs import Gcs

DEFAULT_DATA_ROOT = "/data"
DEFAULT_WORKERS = 8

SPLITS: tuple[str, ...] = ("train", "test")

# verl's reward manager picks GSM8K scoring by this data_source, whichever repo the rows came from.
DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
FORMAT_VERSION = 1
"""Bump when the row format changes, so staged datasets are rebuilt."""

EXIT_OK = 0
EXIT_TRANSIENT = 1
EXIT_PERMANENT = 2

_SHA_RE = re.compile(r"[0-9a-f]{40}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# As verl's extract_solution: the number after "####", sign and decimals kept, commas dropped.
_ANSWER_RE = re.compile(r"####\s*(-?[0-9.,]+)")

# huggingface_hub errors (huggingface_hub.errors) that retrying cannot fix.
_PERMANENT_HUB_ERRORS = frozenset(
    {"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "RemoteEntryNotFoundError",
     "EntryNotFoundError", "DisabledRepoError"}
)


log = logging.getLogger("stage-data")
T = TypeVar("T")


# --- pure parts ---------------------------------------------------------------------------------


def extract_answer(answer: str) -> str:
    """The ground truth of a GSM8K answer: the number after "####", commas removed."""
    match = _ANSWER_RE.search(answer)
    if match is None:
        raise ValueError('no "#### <number>" in the answer')
    return match.group(1).replace(",", "")


def gsm8k_row(*, question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """One row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_answer(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def boxed_answer(solution: str) -> str:
    """The ground truth of a MATH solution as verl's math_dataset.py extracts it (remove_boxed of
    last_boxed_only_string, verl/utils/reward_score/math_reward.py): after the last `\\boxed ` up to a `$` if
    there is one, else inside the last `\\boxed{...}`; ValueError where verl's recipe would stop."""
    if "\\boxed " in solution:
        return solution.split("\\boxed ")[-1].split("$")[0]
    start, depth = solution.rfind("\\boxed"), 0
    for end in range(max(start, 0), len(solution) if start >= 0 else 0):
        depth += {"{": 1, "}": -1}.get(solution[end], 0)
        if solution[end] == "}" and depth == 0:
            box = solution[start:end + 1]
            if box.startswith("\\boxed{"):
                return box[len("\\boxed{"):-1]
            break
    raise ValueError("no \\boxed{...} answer in the solution")


def math_row(*, problem: str, solution: str, split: str, index: int, **kept: Any) -> dict[str, Any]:
    """One row as verl's examples/data_preprocess/math_dataset.py writes it: datasets' map keeps the columns
    it does not pop (MATH's level and type) ahead of those it returns."""
    return {**kept, "data_source": MATH_REPO,
            "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": boxed_answer(solution)},
            "extra_info": {"split": split, "index": index}}


def row_schema() -> pa.Schema:
    """The parquet schema of a row, fields in the order verl's preprocessing creates them."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
                ),
            ),
        ]
    )


def transform_table(table: pa.Table, split: str, *, source: str, repo: str = DEFAULT_DATASET_REPO) -> pa.Table:
    """The raw rows of `repo`'s recipe (GSM8K's question and answer, MATH's problem and solution) as verl
    rows; `source` names the input in errors."""
    import pyarrow as pa

    recipe = recipe_for(repo) or RECIPES[0]
    gsm8k = recipe.repo == DEFAULT_DATASET_REPO
    missing = [c for c in recipe.columns if c not in table.column_names]
    if missing:
        raise StagingError(f"{source} has columns {table.column_names}, lacks {missing}: not a "
                           f"{'GSM8K' if gsm8k else 'MATH'} split", permanent=True)
    rows = []
    for index, raw in enumerate(table.to_pylist()):
        try:
            question, answer = (raw.pop(c) for c in recipe.columns)
            if not isinstance(question, str) or not isinstance(answer, str):
                raise ValueError(f"{' or '.join(recipe.columns)} is not text")
            rows.append(gsm8k_row(question=question, answer=answer, split=split, index=index) if gsm8k else
                        math_row(problem=question, solution=answer, split=split, index=index, **raw))
        except ValueError as e:
            raise StagingError(f"{source} row {index}: {e}", permanent=True) from None
    return pa.Table.from_pylist(rows, schema=row_schema() if gsm8k else None)


def split_files(repo_files: Iterable[str], config: str, split: str) -> list[str]:
    """The parquet shards of one split of one config, e.g. main/train-00000-of-00001.parquet."""
    pattern = re.compile(rf"{re.escape(config)}/{re.escape(split)}-\d{{5}}-of-\d{{5}}\.parquet")
    return sorted(f for f in repo_files if pattern.fullmatch(f))


def model_identity(repo: str, revision: str) -> dict[str, Any]:
    """What a model marker must record for the staged model to count as this one."""
    return {"kind": "model", "repo": repo, "revision": revision}


def dataset_fingerprint(repo: str, config: str, revision: str) -> str:
    """A digest of everything the staged rows depend on: source commit and row format."""
    recipe = recipe_for(repo) or RECIPES[0]
    basis = {
        "repo": repo,
        "config": config,
        "revision": revision,
        "splits": list(SPLITS),
        "data_source": recipe.data_source,
        "instruction": INSTRUCTION if recipe.repo == DEFAULT_DATASET_REPO else MATH_INSTRUCTION,
        "format": FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def dataset_identity(repo: str, config: str, revision: str) -> dict[str, Any]:
    """What a dataset marker must record for the staged dataset to count as this one."""
    return {
        "kind": "dataset",
        "repo": repo,
        "config": config,
        "revision": revision,
        "fingerprint": dataset_fingerprint(repo, config, revision),
    }


@dataclass(frozen=True)
class Decision:
    skip: bool
    reason: str


def decide(
    marker: Mapping[str, Any] | None, identity: Mapping[str, Any], size_of: Callable[[str], int | None]
) -> Decision:
    """Whether staging can be skipped: the marker records this identity and every file it lists
    is present with its recorded size (`size_of` returns None for a missing file)."""
    if marker is None:
        return Decision(False, "nothing staged yet")
    for key, want in identity.items():
        if marker.get(key) != want:
            return Decision(False, f"staged {key} is {marker.get(key)!r}, want {want!r}")
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return Decision(False, "marker lists no files")
    for name, size in sorted(files.items()):
        actual = size_of(name)
        if actual is None:
            return Decision(False, f"{name} is missing")
        if actual != size:
            return Decision(False, f"{name} has {actual} bytes, marker says {size}")
    return Decision(True, f"already staged ({len(files)} files, {format_bytes(sum(files.values()))})")


def size_in(root: Path) -> Callable[[str], int | None]:
    """A `size_of` for `decide` over files under `root`."""

    def size_of(name: str) -> int | None:
        try:
            return (root / name).stat().st_size
        except FileNotFoundError:
            return None

    return size_of


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def progress_line(
    label: str, files_done: int, files_total: int, bytes_done: int, bytes_total: int, seconds: float
) -> str:
    """e.g. `model: 12/37 files, 24.1 GB/65.5 GB (37%), 310.2 MB/s`."""
    pct = 100 * bytes_done // bytes_total if bytes_total else 100
    rate = format_bytes(bytes_done / seconds) + "/s" if seconds > 0 else "-"
    return (
        f"{label}: {files_done}/{files_total} files, "
        f"{format_bytes(bytes_done)}/{format_bytes(bytes_total)} ({pct}%), {rate}"
    )


def hub_error(exc: BaseException, what: str) -> StagingError:
    """A one-line StagingError for a Hugging Face Hub failure while doing `what`.

    Classified by huggingface_hub.errors class names, so this needs no import of the library.
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    status = getattr(getattr(exc, "response", None), "status_code", None)
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    if "GatedRepoError" in names:
        return StagingError(
            f"{what}: gated repository; accept its terms on the Hub with the account of the HF token ({detail})",
            permanent=True,
        )
    if names & _PERMANENT_HUB_ERRORS or status in PERMANENT_HTTP_STATUS:
        return StagingError(f"{what}: {detail}", permanent=True)
    return StagingError(f"{what}: {type(exc).__name__}: {detail}")


def from_hub(what: str, call: Callable[[], T]) -> T:
    """Run one Hub call; any failure becomes a classified StagingError saying what was being done."""
    try:
        return call()
    except StagingError:
        raise
    except Exception as e:
        raise hub_error(e, what) from None


def one_line(message: str, secret: str | None) -> str:
    """The message on one line with the token, should it ever appear, blanked out."""
    line = " ".join(message.split())
    return line.replace(secret, "[redacted]") if secret else line


# --- the token, from Secret Manager through Workload Identity ----------------------------------

METADATA_ROOT = "http://metadata.google.internal/computeMetadata/v1"
"""The GKE metadata server (GCE_METADATA_HOST overrides the host, as in Google's client libraries)."""
SECRET_MANAGER_ROOT = "https://secretmanager.googleapis.com/v1"
SECRET_REQUEST_TIMEOUT_S = 10
SECRET_DEADLINE_S = 600
"""How long to keep asking: GKE's metadata server needs a few seconds on a new pod, and a new IAM
binding can take minutes to apply (both documented by Google); the Job's retries add more."""
SECRET_NAME_RE = re.compile(r"projects/[a-z0-9-]{1,30}/secrets/[A-Za-z0-9_-]{1,255}")
_RETRY_STATUS = frozenset({401, 403, 408, 429, 500, 502, 503, 504})


class _Again(Exception):
    """A failure that asking again later may cure."""


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), which Secret Manager returns as `payload.dataCrc32c`."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _get_json(url: str, headers: Mapping[str, str], what: str, timeout_s: float) -> tuple[int, Any, Any]:
    """(status, parsed body or None, response headers); network failures are `_Again`."""
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read(1 << 20)), response.headers
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read(1 << 16))
        except ValueError:
            body = None
        return e.code, body, e.headers
    except (OSError, ValueError) as e:
        raise _Again(f"{what}: {type(e).__name__}: {e}") from None


def _pod_token(metadata_root: str, timeout_s: float) -> str:
    """The pod's Workload Identity access token from GKE's metadata server."""
    status, body, headers = _get_json(f"{metadata_root}/instance/service-accounts/default/token",
                                      {"Metadata-Flavor": "Google"}, "GKE metadata server", timeout_s)
    if status != 200 or not isinstance(body, dict) or not body.get("access_token"):
        raise _Again(f"GKE metadata server answered {status} to the token request: is Workload Identity on?")
    if headers.get("Metadata-Flavor") != "Google":
        raise StagingError("the metadata server's answer lacks `Metadata-Flavor: Google`: not GKE's metadata "
                           "server; the token is not asked for", permanent=True)
    return str(body["access_token"])


def _access_latest(secret: str, metadata_root: str, api_root: str, timeout_s: float) -> str | None:
    status, body, _ = _get_json(f"{api_root}/{secret}/versions/latest:access",
                                {"Authorization": f"Bearer {_pod_token(metadata_root, timeout_s)}"},
                                "Secret Manager", timeout_s)
    error = body.get("error", {}) if isinstance(body, dict) else {}
    if status == 404:
        return None
    if status in _RETRY_STATUS:
        raise _Again(f"Secret Manager answered {status} {error.get('status', '')} for {secret}".rstrip())
    if status != 200:
        raise StagingError(f"Secret Manager answered {status} {error.get('status', '')} for {secret}: "
                           f"{error.get('message', '')}", permanent=True)
    payload = body.get("payload", {}) if isinstance(body, dict) else {}
    try:
        data = base64.b64decode(payload.get("data", ""), validate=True)
    except ValueError:
        raise _Again(f"Secret Manager's payload for {secret} is not base64") from None
    if "dataCrc32c" in payload and int(payload["dataCrc32c"]) != crc32c(data):
        raise _Again(f"Secret Manager's payload for {secret} fails its CRC32C check")
    token = data.decode("utf-8", "replace").strip()
    return token or None


def read_hf_token(secret: str, **kwargs: Any) -> str | None:
    """The Hugging Face token in `secret`, or None when it has none: the staging then downloads
    anonymously, which public repos allow."""
    token = read_secret(secret, "the Hugging Face token", **kwargs)
    if token is None:
        log.warning("%s has no version: downloading without a Hugging Face token (public repos only). "
                    "Add one with `gcloud secrets versions add %s --project %s --data-file=-`",
                    secret, secret.rsplit("/", 1)[1], secret.split("/")[1])
    return token


def read_secret(secret: str, what: str, *, metadata_root: str | None = None, api_root: str | None = None,
                deadline_s: float | None = None, timeout_s: float = SECRET_REQUEST_TIMEOUT_S,
                sleep: Callable[[float], None] = time.sleep) -> str | None:
    """The value of the newest version of `secret` (`projects/P/secrets/S`), or None when it has none."""
    metadata_root = metadata_root or _metadata_root()
    api_root = api_root or SECRET_MANAGER_ROOT
    end = time.monotonic() + (SECRET_DEADLINE_S if deadline_s is None else deadline_s)
    delay = 1.0
    while True:
        try:
            token = _access_latest(secret, metadata_root, api_root, timeout_s)
        except _Again as e:
            if time.monotonic() + delay > end:
                raise StagingError(f"reading {what} from {secret}: {e}") from None
            log.info("%s not readable yet (%s); asking again in %.0f s", what, e, delay)
            sleep(delay)
            delay = min(delay * 2, 30.0)
            continue
        return token


USER_DATA_RE = re.compile(r"gs://(?P<bucket>[a-z0-9][a-z0-9._-]*[a-z0-9])/(?P<name>[^#]+)#(?P<generation>[0-9]+)"
                          r"=(?P<dest>user-data/[0-9a-f]{16}/[a-z]+\.parquet)")
"""--user-data: `gs://BUCKET/OBJECT#GENERATION=user-data/<digest>/<file>` (domain/user_data.py's objects)."""
STORAGE_TIMEOUT_S = 60.0
"""Each GCS call's bound (a rewrite call copies for a while before it answers)."""


def copy_user_data(copies: Sequence[str], gcs: Gcs) -> None:
    """Copy each pinned generation into the stack's bucket (`gcs`) inside GCS (objects.rewrite: no byte passes
    through the pod), only where the destination is absent (ifGenerationMatch=0: a staged copy is never
    rewritten). Network failures are transient: the Job's retries."""
    from workloads.gcs import PreconditionFailed  # shipped beside this script (workloads/gcs.py)

    for copy in copies:
        m = USER_DATA_RE.fullmatch(copy)
        assert m is not None  # parse_args checked it
        source = f"gs://{m['bucket']}/{m['name']}"
        try:
            # A staged copy (an earlier Job's, whose source need not be live any more) is left as it is.
            if gcs.stat(m["dest"]) is None and gcs.rewrite(m["dest"], m["bucket"], m["name"], int(m["generation"]),
                                                           if_generation_match=0) is None:
                raise StagingError(f"{source} has no generation {m['generation']} any more: pin its current one "
                                   "in verl-gke:dataDir", permanent=True)
        except PreconditionFailed:
            pass  # another Job's copy landed first
        except urllib.error.HTTPError as e:
            e.close()
            if e.code in (401, 403):
                raise StagingError(f"this Job's identity may not read {source}: grant it roles/storage.objectViewer on "
                                   f"gs://{m['bucket']} (docs/verl-settings.md, Your data)", permanent=True) from None
            raise StagingError(f"GCS answered {e.code} to copying {source}") from None
        except (OSError, ValueError, KeyError) as e:  # network, deadline, an answer not GCS's
            raise StagingError(f"GCS: {type(e).__name__}: {e}") from None
        log.info("%s#%s staged as gs://%s/%s", source, m["generation"], gcs.bucket, m["dest"])


def _metadata_root() -> str:
    host = os.environ.get("GCE_METADATA_HOST")
    return f"http://{host}/computeMetadata/v1" if host else METADATA_ROOT


FIELD_MANAGER = "verl-gke-staging"


def copy_wandb_key(secret: str, namespace: str, api: Any = None) -> str:
    """Apply wandb's API key from `secret` as the Kubernetes Secret WANDB_SECRET (server-side apply: created
    the first time, replaced on rotation); returns the key, for redaction. The pod's own token, whose Role
    allows this one name only (manifests/staging.py)."""
    from workloads.kube import Conflict, Invalid, KubernetesApi  # shipped beside this script (workloads/kube.py)

    key = read_secret(secret, "wandb's API key")
    if key is None:
        raise StagingError(f"{secret} has no version, and trainer.logger has wandb: add the API key with "
                           f"`gcloud secrets versions add {secret.rsplit('/', 1)[1]} --project {secret.split('/')[1]} "
                           "--data-file=-`, then `pulumi up` again", permanent=True)
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": WANDB_SECRET, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "verl-gke"}},
            "data": {WANDB_SECRET_KEY: base64.b64encode(key.encode()).decode()}}
    api = api or KubernetesApi.in_cluster()
    try:
        api.request("PATCH", f"/api/v1/namespaces/{namespace}/secrets/{WANDB_SECRET}"
                             f"?fieldManager={FIELD_MANAGER}&force=true", body,
                    content_type="application/apply-patch+yaml")
    except (OSError, Conflict, Invalid) as e:
        raise StagingError(f"writing Secret {namespace}/{WANDB_SECRET}: {one_line(str(e), key)}") from None
    log.info("wandb's API key from %s is in Secret %s/%s", secret, namespace, WANDB_SECRET)
    return key


# --- the Hub ------------------------------------------------------------------------------------


class Hub(Protocol):
    """What staging needs from the Hugging Face Hub."""

    def list_files(self, repo: str, repo_type: str, revision: str) -> dict[str, int]:
        """Every file of the repo at `revision`: path -> size in bytes."""
        ...

    def download(self, repo: str, repo_type: str, revision: str, filename: str, local_dir: Path) -> Path:
        """Fetch one file into `local_dir` (keeping its repo path); return where it landed."""
        ...


class HfHub:
    """The real Hub, through huggingface_hub."""

    def __init__(self, token: str | None) -> None:
        self._token = token

    def list_files(self, repo: str, repo_type: str, revision: str) -> dict[str, int]:
        from huggingface_hub import HfApi

        info = HfApi().repo_info(repo, repo_type=repo_type, revision=revision, files_metadata=True, token=self._token)
        return {s.rfilename: int(s.size or 0) for s in info.siblings or []}

    def download(self, repo: str, repo_type: str, revision: str, filename: str, local_dir: Path) -> Path:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(
            repo, filename, repo_type=repo_type, revision=revision, local_dir=local_dir, token=self._token
        )
        return Path(str(path))


# --- staging ------------------------------------------------------------------------------------


def _download(hub: Hub, repo: str, repo_type: str, revision: str, filename: str, local_dir: Path) -> Path:
    return from_hub(
        f"downloading {filename} from {repo}@{revision}",
        lambda: hub.download(repo, repo_type, revision, filename, local_dir),
    )


def stage_model(hub: Hub, *, repo: str, revision: str, dest: Path, workers: int) -> bool:
    """Download every file of the model at `revision` into `dest`; False when already there."""
    marker_path = dest / MARKER_NAME
    identity = model_identity(repo, revision)
    decision = decide(read_marker(marker_path), identity, size_in(dest))
    if decision.skip:
        log.info("model %s@%s: %s, skipping", repo, revision, decision.reason)
        return False
    log.info("model %s@%s -> %s: %s", repo, revision, dest, decision.reason)
    dest.mkdir(parents=True, exist_ok=True)
    marker_path.unlink(missing_ok=True)

    files = from_hub(f"listing model {repo}@{revision}", lambda: hub.list_files(repo, "model", revision))
    if not files:
        raise StagingError(f"model {repo}@{revision} has no files", permanent=True)
    total = sum(files.values())
    log.info("model: %d files, %s to fetch with %d workers", len(files), format_bytes(total), workers)
    started, done_files, done_bytes = time.monotonic(), 0, 0
    # Largest first keeps the workers busy until the end instead of waiting on one last shard.
    order = sorted(files, key=lambda name: (-files[name], name))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_download, hub, repo, "model", revision, name, dest): name for name in order}
        try:
            for future in as_completed(futures):
                future.result()
                done_files += 1
                done_bytes += files[futures[future]]
                log.info(progress_line("model", done_files, len(files), done_bytes, total, time.monotonic() - started))
        except BaseException:
            # Fail now, not after every queued shard: only downloads already running are awaited.
            for future in futures:
                future.cancel()
            raise

    size_of = size_in(dest)
    for name, size in sorted(files.items()):
        if size_of(name) != size:
            raise StagingError(f"model file {name}: {size_of(name)} bytes on the bucket, the Hub says {size}")
    write_marker(marker_path, make_marker(identity, files))
    log.info("model staged in %s (%s)", dest, format_bytes(total))
    return True


def stage_dataset(hub: Hub, *, repo: str, config: str, revision: str, dest: Path) -> bool:
    """Write the dataset's splits as verl parquet files into `dest` (its recipe's rows); False when already there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker_path = dest / MARKER_NAME
    identity = dataset_identity(repo, config, revision)
    decision = decide(read_marker(marker_path), identity, size_in(dest))
    if decision.skip:
        log.info("dataset %s@%s: %s, skipping", repo, revision, decision.reason)
        return False
    log.info("dataset %s (%s)@%s -> %s: %s", repo, config, revision, dest, decision.reason)
    dest.mkdir(parents=True, exist_ok=True)
    marker_path.unlink(missing_ok=True)

    repo_files = from_hub(f"listing dataset {repo}@{revision}", lambda: hub.list_files(repo, "dataset", revision))
    written: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="dataset-") as raw:
        for split in SPLITS:
            shards = split_files(repo_files, config, split)
            if not shards:
                raise StagingError(
                    f"dataset {repo}@{revision} has no {config}/{split}-*.parquet", permanent=True
                )
            parts = []
            for shard in shards:
                local = _download(hub, repo, "dataset", revision, shard, Path(raw))
                parts.append(pq.read_table(local))
            source = f"{repo}@{revision}:{config}/{split}"
            table = transform_table(pa.concat_tables(parts), split, source=source, repo=repo)
            name = f"{split}.parquet"
            tmp = dest / f".{name}.tmp"
            pq.write_table(table, tmp)
            os.replace(tmp, dest / name)
            written[name] = (dest / name).stat().st_size
            log.info("dataset: %s, %d rows, %s", dest / name, table.num_rows, format_bytes(written[name]))
    write_marker(marker_path, make_marker(identity, written))
    return True


@dataclass(frozen=True)
class Settings:
    model_repo: str
    model_revision: str
    model_dir: str
    dataset_repo: str
    dataset_config: str
    """The folder of the dataset's shards; its recipe's (staged.Recipe.config) unless given."""
    dataset_revision: str
    data_root: Path
    workers: int
    verl_wheel_url: str | None = None
    verl_wheel_sha256: str | None = None
    verl_dir: str | None = None
    """Directory under the data root for verl; all three set, or none (the image has verl)."""
    hf_token_secret: str | None = None
    """`projects/P/secrets/S`: the Secret Manager secret holding the Hugging Face token."""
    wandb_key_secret: str | None = None
    """`projects/P/secrets/S` holding wandb's API key, copied into Secret WANDB_SECRET of `namespace`."""
    namespace: str | None = None
    user_data: tuple[str, ...] = ()
    """--user-data copies (USER_DATA_RE) into `bucket`, the stack's bucket."""
    bucket: str | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise StagingError(f"bad arguments: {message}", permanent=True)


def parse_args(argv: Sequence[str]) -> Settings:
    """The command line, checked; any problem is a permanent StagingError naming the flag."""
    p = _Parser(prog="stage_data.py", description=__doc__.splitlines()[0])
    p.add_argument("--model-repo", default=DEFAULT_MODEL_REPO)
    p.add_argument("--model-revision", default=DEFAULT_MODEL_REVISION)
    p.add_argument("--model-dir", default=None, help="directory under the data root (default: the repo name)")
    p.add_argument("--dataset-repo", default=DEFAULT_DATASET_REPO)
    p.add_argument("--dataset-config", default=None, help="default: the recipe's (main for GSM8K, data for MATH)")
    p.add_argument("--dataset-revision", default=None, help="default: the recipe's pinned commit")
    p.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    p.add_argument("--verl-wheel-url", default=None, help="https URL of a verl wheel to unpack on the bucket")
    p.add_argument("--verl-wheel-sha256", default=None)
    p.add_argument("--verl-dir", default=None, help="directory under the data root for verl")
    p.add_argument("--hf-token-secret", default=None, help="projects/P/secrets/S holding the Hugging Face token")
    p.add_argument("--wandb-key-secret", default=None, help="projects/P/secrets/S holding wandb's API key")
    p.add_argument("--namespace", default=None, help="where the wandb key's Kubernetes Secret goes")
    p.add_argument("--user-data", action="append", default=[], help="gs://B/O#GENERATION=user-data/<digest>/<file>")
    p.add_argument("--bucket", default=None, help="the stack's bucket, where --user-data is copied")
    a = p.parse_args(list(argv))

    model_dir = a.model_dir if a.model_dir is not None else model_dir_for(a.model_repo)
    recipe = recipe_for(a.dataset_repo)
    dataset_config = a.dataset_config or (recipe.config if recipe else "main")
    pinned = recipe.revision if recipe and recipe.repo == a.dataset_repo else DEFAULT_DATASET_REVISION
    a.dataset_revision = a.dataset_revision or pinned
    dataset_dirs = tuple(r.dir for r in RECIPES)
    problems = []
    for flag, value in (("--model-repo", a.model_repo), ("--dataset-repo", a.dataset_repo)):
        if not is_repo_id(value):
            problems.append(f"{flag} {value!r} is not a Hub repo id like owner/name")
    if is_repo_id(a.dataset_repo) and (problem := dataset_problem(a.dataset_repo)):
        problems.append(f"--dataset-repo {a.dataset_repo!r}: {problem}")
    for flag, value in (("--model-revision", a.model_revision), ("--dataset-revision", a.dataset_revision)):
        if not _SHA_RE.fullmatch(value):
            problems.append(f"{flag} {value!r} is not a commit SHA (40 lowercase hex digits); pin one")
    if not _NAME_RE.fullmatch(model_dir) or model_dir in dataset_dirs:
        problems.append(
            f"--model-dir {model_dir!r} must be one directory name of letters, digits, '.', '_', '-'"
            f" other than {' and '.join(map(repr, dataset_dirs))}"
        )
    if not _NAME_RE.fullmatch(dataset_config):
        problems.append(f"--dataset-config {dataset_config!r} is not a config name")
    if not 1 <= a.workers <= 64:
        problems.append(f"--workers {a.workers} must be 1..64")
    verl_flags = {"--verl-wheel-url": a.verl_wheel_url, "--verl-wheel-sha256": a.verl_wheel_sha256,
                  "--verl-dir": a.verl_dir}
    if any(v is not None for v in verl_flags.values()):
        missing = [flag for flag, v in verl_flags.items() if v is None]
        if missing:
            problems.append(f"{', '.join(verl_flags)} go together; missing {', '.join(missing)}")
        if a.verl_wheel_url is not None and not (
                a.verl_wheel_url.startswith("https://") and a.verl_wheel_url.endswith(".whl")):
            problems.append(f"--verl-wheel-url {a.verl_wheel_url!r} is not an https URL of a .whl file")
        if a.verl_wheel_sha256 is not None and not _SHA256_RE.fullmatch(a.verl_wheel_sha256):
            problems.append(f"--verl-wheel-sha256 {a.verl_wheel_sha256!r} is not 64 lowercase hex digits")
        if a.verl_dir is not None and (not _NAME_RE.fullmatch(a.verl_dir) or a.verl_dir in (*dataset_dirs, model_dir)):
            problems.append(f"--verl-dir {a.verl_dir!r} must be one directory name, not the model's or the dataset's")
    if a.hf_token_secret is not None and not SECRET_NAME_RE.fullmatch(a.hf_token_secret):
        problems.append(f"--hf-token-secret {a.hf_token_secret!r} is not a secret name like projects/P/secrets/S")
    if a.wandb_key_secret is not None and not SECRET_NAME_RE.fullmatch(a.wandb_key_secret):
        problems.append(f"--wandb-key-secret {a.wandb_key_secret!r} is not a secret name like projects/P/secrets/S")
    if a.wandb_key_secret is not None and not a.namespace:
        problems.append("--wandb-key-secret needs --namespace")
    problems += [f"--user-data {c!r} is not gs://BUCKET/OBJECT#GENERATION=user-data/<digest>/<file>"
                 for c in a.user_data if not USER_DATA_RE.fullmatch(c)]
    if a.user_data and not a.bucket:
        problems.append("--user-data needs --bucket")
    if problems:
        raise StagingError("; ".join(problems), permanent=True)
    return Settings(
        model_repo=a.model_repo,
        model_revision=a.model_revision,
        model_dir=model_dir,
        dataset_repo=a.dataset_repo,
        dataset_config=dataset_config,
        dataset_revision=a.dataset_revision,
        data_root=Path(a.data_root),
        workers=a.workers,
        verl_wheel_url=a.verl_wheel_url,
        verl_wheel_sha256=a.verl_wheel_sha256,
        verl_dir=a.verl_dir,
        hf_token_secret=a.hf_token_secret,
        wandb_key_secret=a.wandb_key_secret,
        namespace=a.namespace,
        user_data=tuple(a.user_data),
        bucket=a.bucket,
    )


def run(settings: Settings, hub: Hub) -> None:
    """Stage verl and the dataset (seconds each), then the model (the long part) under the data root."""
    if not settings.data_root.is_dir():
        raise StagingError(
            f"data root {settings.data_root} is not a directory: is the bucket claim mounted?", permanent=True
        )
    started = time.monotonic()
    if settings.verl_wheel_url and settings.verl_wheel_sha256 and settings.verl_dir:
        stage_wheel(url=settings.verl_wheel_url, sha256=settings.verl_wheel_sha256,
                    dest=settings.data_root / settings.verl_dir)
    stage_dataset(
        hub,
        repo=settings.dataset_repo,
        config=settings.dataset_config,
        revision=settings.dataset_revision,
        dest=settings.data_root / (recipe_for(settings.dataset_repo) or RECIPES[0]).dir,
    )
    stage_model(
        hub,
        repo=settings.model_repo,
        revision=settings.model_revision,
        dest=settings.data_root / settings.model_dir,
        workers=settings.workers,
    )
    log.info("staging done in %.0f s", time.monotonic() - started)


def main(argv: Sequence[str] | None = None, hub: Hub | None = None) -> int:
    logging.basicConfig(
        format="%(asctime)s stage-data %(levelname)s %(message)s", level=logging.INFO, stream=sys.stdout
    )
    token = os.environ.get("HF_TOKEN") or None  # outside the cluster, e.g. a user's own run
    secret = wandb = None
    try:
        settings = parse_args(sys.argv[1:] if argv is None else argv)
        if settings.wandb_key_secret and settings.namespace:
            # First: a missing key fails the Job (and `pulumi up`) before the long model download.
            wandb = copy_wandb_key(settings.wandb_key_secret, settings.namespace)
        if settings.user_data and settings.bucket:  # before the model: a refused grant fails in seconds
            from workloads.gcs import Gcs  # shipped beside this script (workloads/gcs.py)

            copy_user_data(settings.user_data, Gcs.in_pod(settings.bucket, str(settings.data_root),
                                                          timeout_s=STORAGE_TIMEOUT_S))
        secret = settings.hf_token_secret
        if secret:
            token = read_hf_token(secret)
        run(settings, hub if hub is not None else HfHub(token))
    except StagingError as e:
        message = str(e)
        if e.permanent and secret and token is None:
            message += (f" (no Hugging Face token was used: {secret} has no version; add one with "
                        f"`gcloud secrets versions add {secret.rsplit('/', 1)[1]} --project {secret.split('/')[1]} "
                        "--data-file=-` and run `pulumi up` again)")
        print(f"stage-data: failed: {one_line(one_line(message, token), wandb)}", file=sys.stderr)
        return EXIT_PERMANENT if e.permanent else EXIT_TRANSIENT
    except Exception as e:  # noqa: BLE001 - any other failure still ends in one line, and a retry
        print(f"stage-data: failed: {one_line(one_line(f'{type(e).__name__}: {e}', token), wandb)}", file=sys.stderr)
        return EXIT_TRANSIENT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

"""What the program and the staging Job (workloads/stage_data.py) share: the default model and
dataset, the bucket's staged names, the checks of a repo id, and verl's wheel fetched, checked against
its sha256 and unpacked exactly. Standard library only and importing nothing of the project: the
bottom of the import graph, shipped into the staging Job's ConfigMap beside stage_data.py."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

# Commits, not branches, so a rerun stages the same bytes. Both SHAs are the ones public projects
# cite for these repos (the Hub itself is out of reach where this was written).
DEFAULT_MODEL_REPO = "Qwen/Qwen2.5-32B-Instruct"
DEFAULT_MODEL_REVISION = "5ede1c97bbab6ce5cda5812749b4c0bdf79b18dd"
DEFAULT_DATASET_REPO = "openai/gsm8k"
DEFAULT_DATASET_REVISION = "740312add88f781978c0658806c59bc2815b9866"
DATASET_DIR = "gsm8k"
MATH_REPO = "DigitalLearningGmbH/MATH-lighteval"
MATH_REVISION = "0530c78699ea5e8eb5530600900e1f328b48acad"
"""The commit public projects cite for MATH-lighteval's data/train-00000-of-00001.parquet (7,500 problems)."""
MARKER_NAME = ".verl-gke-staged.json"
WANDB_SECRET = "wandb-api-key"
"""The Kubernetes Secret holding wandb's API key, in the stack's namespace (staging may write it alone)."""
WANDB_SECRET_KEY = "api-key"

_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_REPO_NAME = 96
PERMANENT_HTTP_STATUS = frozenset({401, 403, 404})

# Per socket operation, and for a whole wheel download: a stalled server never hangs the Job.
WHEEL_SOCKET_TIMEOUT_S = 30
WHEEL_DEADLINE_S = 300
_CHUNK = 1 << 20

log = logging.getLogger("stage-data")


class StagingError(Exception):
    """A failure with a one-line reason; `permanent` when retrying cannot help."""

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.permanent = permanent


def is_repo_id(value: str) -> bool:
    """A Hugging Face repo id `owner/name` as the Hub accepts it: letters, digits, '.', '_', '-',
    no '--' or '..', a name of at most 96 characters, not ending in '.' or '.git'."""
    return (bool(_REPO_RE.fullmatch(value)) and "--" not in value and ".." not in value
            and len(value.split("/")[1]) <= _MAX_REPO_NAME and not value.endswith((".", ".git")))


@dataclass(frozen=True)
class Recipe:
    """A Hugging Face dataset staging turns into verl's rows as verl's examples/data_preprocess/<script> does."""

    repo: str
    revision: str
    """The pinned commit of `repo`; a copy in its layout names its own."""
    marker: str
    """A repo whose name contains it (lower case) is a copy in this layout."""
    config: str
    """The folder of its parquet shards, <config>/<split>-NNNNN-of-NNNNN.parquet."""
    columns: tuple[str, str]
    """The question's and the answer's columns."""
    data_source: str
    """What verl's recipe writes, and what verl's default_compute_score picks the reward by."""
    dir: str
    """Under the data root."""
    sample: tuple[str, str]
    """(solution_str, ground_truth) verl's reward for data_source scores 1: the synth check's sample row."""
    train_rows: int
    """Rows of the train split at `revision` (the run's steps: verl's loader drops the last partial batch)."""
    test_rows: int
    """Rows of the test split at `revision`: the prompts of each validation pass (data.val_files, one response each)."""
    prompt_tokens: int
    """Mean prompt: the question, verl's recipe's instruction and the chat template. An assumption, not measured."""
    response_tokens: int
    """Mean response of Qwen2.5-32B-Instruct to it (data.max_response_length caps it). An assumption, not measured."""


# Rows: each dataset card's dataset_info at the pinned revision (GSM8K main; MATH-lighteval default: 5,984,772
# bytes of problems and worked solutions in 7,500 train rows, ~800 a row). Tokens: a GSM8K question ~70, a MATH
# problem ~90 (a third of a row's bytes), plus verl's instruction and the chat template's ~60; a response ~2.5x
# the reference answer (GSM8K's ~130 tokens, MATH's ~220) as Qwen2.5-32B-Instruct reasons step by step.
RECIPES = (
    Recipe(DEFAULT_DATASET_REPO, DEFAULT_DATASET_REVISION, "gsm8k", "main", ("question", "answer"),
           "openai/gsm8k", DATASET_DIR, ("3 + 4 = 7\n#### 7", "7"), train_rows=7473, test_rows=1319,
           prompt_tokens=128, response_tokens=320),
    Recipe(MATH_REPO, MATH_REVISION, "math-lighteval", "data", ("problem", "solution"), MATH_REPO, "math",
           ("3 + 4 = \\boxed{7}", "7"), train_rows=7500, test_rows=5000, prompt_tokens=150, response_tokens=550),
)
"""verl 0.6.1's other recipes need what the stack lacks: images (geo3k), a reward model (full_hh_rlhf), a
data_source no default reward scores (hellaswag), tools or a retriever (search_r1, *_w_tool, multiturn)."""


def recipe_for(repo: str) -> Recipe | None:
    """The recipe staging applies to `repo`: by its name, so a copy in the same layout takes it too."""
    name = repo.split("/", 1)[-1].lower()
    return next((r for r in RECIPES if r.marker in name), None)


def dataset_problem(repo: str) -> str | None:
    """Why staging cannot stage `repo` (a repo id), or None: the Pulumi program refuses others at synth and
    preview, and staging at start (the layout itself is checked on the Hub's files, split_files)."""
    if recipe_for(repo):
        return None
    return ("staging preprocesses only " + " and ".join(
        f"{r.repo} (or a copy whose name contains {r.marker}, {r.config}/train-* and {r.config}/test-* parquet "
        f"shards of {' and '.join(r.columns)})" for r in RECIPES)
        + " as verl's examples/data_preprocess does; for other data, verl-gke:dataDir.")


def model_dir_for(repo: str) -> str:
    """The tutorial's directory for a model: its repo name (Qwen/Qwen2.5-32B-Instruct -> Qwen2.5-32B-Instruct)."""
    return repo.rsplit("/", 1)[-1]


def make_marker(identity: Mapping[str, Any], files: Mapping[str, int]) -> dict[str, Any]:
    """A marker: the identity plus the size of every staged file (relative path -> bytes)."""
    return {**identity, "files": dict(sorted(files.items()))}


def read_marker(path: Path) -> dict[str, Any] | None:
    """The marker at `path`, or None when there is none or it is unreadable (then staging redoes)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable marker %s: %s", path, e)
        return None
    return data if isinstance(data, dict) else None


def write_marker(path: Path, marker: Mapping[str, Any]) -> None:
    """Write the marker last and atomically, so a half-done run never looks finished."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def wheel_identity(url: str, sha256: str) -> dict[str, Any]:
    """What a wheel marker must record for the unpacked tree to count as this wheel."""
    return {"kind": "wheel", "url": url, "sha256": sha256}


def fetch_verified(url: str, sha256: str, dest: Path, *, socket_timeout_s: float = WHEEL_SOCKET_TIMEOUT_S,
                   deadline_s: float = WHEEL_DEADLINE_S) -> None:
    """Download `url` to `dest`, refusing bytes whose sha256 is not `sha256`; within `deadline_s`."""
    digest = hashlib.sha256()
    part = dest.with_name(dest.name + ".part")
    give_up = time.monotonic() + deadline_s
    try:
        with urllib.request.urlopen(url, timeout=socket_timeout_s) as response, part.open("wb") as out:
            # read1: whatever has arrived, so a server dripping bytes still meets the deadline.
            while chunk := response.read1(_CHUNK):
                if time.monotonic() > give_up:
                    raise StagingError(f"downloading {url}: not done after {deadline_s:.0f} s")
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as e:
        raise StagingError(f"downloading {url}: HTTP {e.code}", permanent=e.code in PERMANENT_HTTP_STATUS) from None
    except (OSError, urllib.error.URLError) as e:
        raise StagingError(f"downloading {url}: {e}") from None
    if digest.hexdigest() != sha256:
        part.unlink(missing_ok=True)
        raise StagingError(f"{url} has sha256 {digest.hexdigest()}, pinned {sha256}: refusing it", permanent=True)
    os.replace(part, dest)


def _members(archive: zipfile.ZipFile) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """The wheel's files, each checked to land inside the target as pip lays it out."""
    members = []
    for info in archive.infolist():
        if info.is_dir():
            continue
        parts = PurePosixPath(info.filename).parts
        # A `.data/` member would go outside site-packages under pip (scripts, headers).
        if info.filename.startswith("/") or ".." in parts or parts[0].endswith(".data"):
            raise StagingError(f"{archive.filename}: unexpected member {info.filename!r}", permanent=True)
        members.append((info, PurePosixPath(info.filename)))
    return members


def unpack_wheel(wheel: Path, dest: Path) -> dict[str, int]:
    """Unpack a pure-Python wheel into `dest` as `pip install --no-deps --target` lays it out;
    return its files (relative path -> bytes)."""
    files: dict[str, int] = {}
    with zipfile.ZipFile(wheel) as archive:
        for info, path in _members(archive):
            target = dest.joinpath(*path.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            files[info.filename] = info.file_size
    return files


def wheel_digests(wheel: Path) -> dict[str, str]:
    """sha256 of each file the wheel unpacks to (relative path -> hex), from the wheel's own bytes."""
    with zipfile.ZipFile(wheel) as archive:
        return {info.filename: hashlib.sha256(archive.read(info)).hexdigest() for info, _ in _members(archive)}


def tree_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` but the marker (relative path -> hex); {} when there is none."""
    found = {}
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        name = path.relative_to(root).as_posix()
        if path.is_file() and name != MARKER_NAME:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def stage_wheel(*, url: str, sha256: str, dest: Path) -> bool:
    """Make `dest` exactly the wheel at `url` (checked against `sha256`): each of its files with the
    wheel's bytes and nothing else but the marker. Every Ray process has `dest` first on its path, so
    an added `sitecustomize.py`, a module shadowing another or a stale `__pycache__/*.pyc` would run in
    each of them; the tree is compared with the pinned wheel itself (never with a size or the bucket's
    marker). False when it already was exactly that."""
    marker_path = dest / MARKER_NAME
    identity = wheel_identity(url, sha256)
    name = url.rsplit("/", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="wheel-") as tmp:
        wheel = Path(tmp) / name
        fetch_verified(url, sha256, wheel)
        want, have = wheel_digests(wheel), tree_digests(dest)
        changed = sorted(f for f, digest in want.items() if have.get(f) != digest)
        extra = sorted(set(have) - set(want))
        marker = read_marker(marker_path)
        if not changed and not extra and marker is not None and all(marker.get(k) == v for k, v in identity.items()):
            log.info("%s: already staged (%d files, each as in the wheel), skipping", name, len(want))
            return False
        for what, files in (("missing or changed", changed), ("not in the wheel", extra)):
            if files and have:
                log.warning("%s: %d files %s, restoring: %s", dest, len(files), what,
                            ", ".join(files[:5]) + (", ..." if len(files) > 5 else ""))
        dest.mkdir(parents=True, exist_ok=True)
        marker_path.unlink(missing_ok=True)
        for file in extra:
            (dest / file).unlink()
        for folder in sorted({p for f in extra for p in (dest / f).parents if dest in p.parents}, reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        files = unpack_wheel(wheel, dest)
    write_marker(marker_path, make_marker(identity, files))
    log.info("%s unpacked in %s (%d files)", name, dest, len(files))
    return True

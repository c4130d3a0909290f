"""Your own data (verl-gke:dataDir): train.parquet and test.parquet in verl's RL format, from a local folder
(checked offline, uploaded by the program) or from gs:// objects pinned by their generations (checked at
preview from the parquet footers), under a digest of the files (the same data, the same objects and paths;
the run reads them through the mount)."""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from domain.bucket import MOUNT_PATH
from domain.platforms import VerlRelease
from domain.problems import problem_line
from domain.verl_settings import VerlSettings
from domain.verl_wheel import unpacked

KEY = "verl-gke:dataDir"
FILES = {"data.train_files": "train.parquet", "data.val_files": "test.parquet"}
BUCKET_DIR = "user-data"
"""Objects at user-data/<digest>/<file>: staging's side of the bucket (the Ray pods only read it)."""
CUSTOM_REWARD = "custom_reward_function.path"
_SHOWN = 5


_GS = re.compile(r"gs://(?P<bucket>[a-z0-9][a-z0-9._-]{1,220}[a-z0-9])/(?P<prefix>[^#]*)"
                 r"#train\.parquet=(?P<train>[0-9]+),test\.parquet=(?P<test>[0-9]+)")
GS_FORM = "gs://BUCKET/PREFIX/#train.parquet=GENERATION,test.parquet=GENERATION"


@dataclass(frozen=True)
class GsData:
    """verl-gke:dataDir as gs:// objects, each pinned by its generation (GCS's version number of the object)."""

    bucket: str
    prefix: str
    generations: dict[str, int]
    """File name (train.parquet, test.parquet) -> the generation the stack file pins."""

    def object(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def url(self, name: str) -> str:
        return f"gs://{self.bucket}/{self.object(name)}"


def gs_data(value: str) -> GsData | None:
    """The gs:// form of `value`; None when it is not one (problems() says why)."""
    m = _GS.fullmatch(value)
    if m is None:
        return None
    prefix = m["prefix"] if not m["prefix"] or m["prefix"].endswith("/") else f"{m['prefix']}/"
    return GsData(m["bucket"], prefix, {"train.parquet": int(m["train"]), "test.parquet": int(m["test"])})


def pin_command(url: str) -> str:
    return f'`gcloud storage objects describe {url} --format="value(generation)"`'


def digest(folder: Path | str) -> str:
    """Of both files' bytes (or, from gs://, their URLs and pinned generations): new data, new objects and paths
    (so a new run id); the same, nothing changes."""
    h = hashlib.sha256()
    gs = gs_data(folder) if isinstance(folder, str) else None
    folder = Path(folder).expanduser()
    for name in FILES.values():
        content = f"{gs.url(name)}#{gs.generations[name]}".encode() if gs else (folder / name).read_bytes()
        h.update(name.encode() + b"\0" + content)
    return h.hexdigest()[:16]


def object_names(folder: Path | str) -> dict[str, str]:
    """verl path -> the object's name in the bucket."""
    d = digest(folder)
    return {path: f"{BUCKET_DIR}/{d}/{name}" for path, name in FILES.items()}


def gs_copies(value: str) -> tuple[str, ...]:
    """Staging's copies of gs:// data: `gs://B/O#GENERATION=<object in the stack's bucket>`; () for a folder."""
    gs = gs_data(value)
    if gs is None:
        return ()
    return tuple(f"{gs.url(name)}#{gs.generations[name]}={object_names(value)[path]}" for path, name in FILES.items())


def verl_paths(value: str) -> dict[str, str]:
    """data.train_files and data.val_files on the mount; {} when the data cannot be read (problems() says why)."""
    if value.startswith("gs://"):
        return {path: f"{MOUNT_PATH}/{name}" for path, name in object_names(value).items()} if gs_data(value) else {}
    try:
        return {path: f"{MOUNT_PATH}/{name}" for path, name in object_names(Path(value).expanduser()).items()}
    except OSError:
        return {}


@cache
def known_sources(release: VerlRelease) -> tuple[frozenset[str], tuple[str, ...]]:
    """The data_source values verl's default_compute_score scores (verl/utils/reward_score/__init__.py of the
    release): those it compares with `==` or `in [...]`, and the prefixes it takes with `startswith`."""
    tree = ast.parse((unpacked(release) / "verl/utils/reward_score/__init__.py").read_text())
    [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "default_compute_score"]
    names: set[str] = set()
    prefixes: list[str] = []

    def strings(node: ast.AST) -> list[str]:
        items = node.elts if isinstance(node, ast.List | ast.Tuple | ast.Set) else [node]
        return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]

    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "data_source":
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, ast.Eq | ast.In):
                    names.update(strings(right))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "data_source"):
            prefixes += [s for arg in node.args for s in strings(arg)]
    return frozenset(names), tuple(prefixes)


def row_counts(value: str) -> dict[str, int] | None:
    """verl path (data.train_files, data.val_files) -> a local folder's rows, from the parquet footers; None for
    gs:// data (its footers are read at preview) or unreadable files (problems() says why)."""
    if not value or value.startswith("gs://"):
        return None
    import pyarrow.parquet as pq  # here: some 0.5 CPU s to import, and only a local dataDir needs it

    try:
        return {path: pq.ParquetFile(Path(value).expanduser() / name).metadata.num_rows
                for path, name in FILES.items()}
    except Exception:  # noqa: BLE001 dataDir's own check reports what is wrong with the file
        return None


def folder_rows(value: str, run: VerlSettings) -> list[tuple[str, dict[str, Any]]] | None:
    """reward_rows of a local folder's train.parquet and test.parquet; None for gs:// data (read at preview) or
    without readable data."""
    if not value or value.startswith("gs://"):
        return None
    rows: list[tuple[str, dict[str, Any]]] = []
    for name in FILES.values():
        try:
            found = reward_rows(lambda name=name: Path(value).expanduser() / name, run, name)
        except Exception:  # noqa: BLE001 dataDir's own check reports what is wrong with the file
            continue
        rows += found if isinstance(found, list) else []
    return rows or None


REWARD_READ_BYTES = 8_000_000
"""At most this much of a gs:// file's first row group is read at preview for the reward's rows."""


def reward_rows(source: Any, run: VerlSettings, where: str) -> list[tuple[str, dict[str, Any]]] | str:
    """The calls verl's reward manager makes (verl/workers/reward_manager/naive.py: the row's data_source,
    reward_model.ground_truth and extra_info with num_turns and rollout_reward_scores added) for one row per
    data_source of the first row group of the parquet file opened from `source()`, each answered with its ground
    truth; why not, when those columns of the row group are over REWARD_READ_BYTES."""
    import pyarrow.parquet as pq

    source_key = str(run.get("data.reward_fn_key") or "data_source")
    file = pq.ParquetFile(source())
    wanted = [c for c in (source_key, "reward_model", "extra_info") if c in file.schema_arrow.names]
    group = file.metadata.row_group(0)
    size = sum(group.column(i).total_compressed_size for i in range(group.num_columns)
               if group.column(i).path_in_schema.split(".")[0] in wanted)
    if size > REWARD_READ_BYTES:
        return (f"its first row group's {', '.join(wanted[:-1])} and {wanted[-1]} take {size / 1e6:.1f} MB, over "
                f"the {REWARD_READ_BYTES / 1e6:g} MB preview reads")
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for index, row in enumerate(file.read_row_group(0, columns=wanted).to_pylist()):
        data_source, truth = str(row[source_key]), (row["reward_model"] or {}).get("ground_truth")
        if data_source not in seen and len(seen) < _SHOWN:
            extra = {**(row.get("extra_info") or {}), "num_turns": None, "rollout_reward_scores": {}}
            seen[data_source] = (f"row {index} of {where} ({source_key} {data_source})", {
                "data_source": data_source, "solution_str": str(truth), "ground_truth": truth, "extra_info": extra})
    return list(seen.values())


def _columns(schema: Any, prompt_key: str, source_key: str) -> list[str]:
    """What verl's RLHFDataset and reward manager read that the file lacks (verl/utils/dataset/rl_dataset.py:
    the chat messages under data.prompt_key; verl/workers/reward_manager: data.reward_fn_key and
    reward_model.ground_truth)."""
    import pyarrow as pa

    missing = [c for c in (prompt_key, source_key, "reward_model") if c not in schema.names]
    if prompt_key in schema.names and not pa.types.is_list(schema.field(prompt_key).type):
        missing.append(f"{prompt_key} (a list of chat messages)")
    if "reward_model" in schema.names:
        kind = schema.field("reward_model").type
        if not pa.types.is_struct(kind) or kind.get_field_index("ground_truth") < 0:
            missing.append("reward_model.ground_truth")
    return missing


def problems(value: str, release: VerlRelease, run: VerlSettings) -> list[str]:
    """Each problem of `value` as one line: not a local folder or pinned gs:// objects, a file missing or
    unreadable, a column verl reads missing, data_source values verl's default reward does not score (any
    value passes with a custom reward function). gs:// objects are read at preview (domain/preflight.py)."""
    if not value:
        return []
    if value.startswith("gs://"):
        if gs_data(value) is None:
            first = value.split("#")[0].rstrip("/") + "/train.parquet"
            return [problem_line(KEY, value, f"{GS_FORM}, each object pinned by its generation (read it with "
                                 f"{pin_command(first)}), or a local folder.")]
        return []
    folder = Path(value).expanduser()
    absent = [name for name in FILES.values() if not (folder / name).is_file()]
    if absent:
        return [problem_line(KEY, value, f"a folder holding {' and '.join(FILES.values())} in verl's RL format "
                             f"(missing {', '.join(absent)}).")]
    out = []
    for name in FILES.values():
        out += file_problems(value, name, lambda name=name: folder / name, release, run, read_sources=True)
    return out


def file_problems(value: str, name: str, source: Any, release: VerlRelease, run: VerlSettings, *,
                  read_sources: bool) -> list[str]:
    """The problems of one parquet file opened from `source()` (a path, or a buffer holding at least its footer);
    its data_source values only when `read_sources` (they need the column's data, not only the footer)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    prompt_key = str(run.get("data.prompt_key") or "prompt")
    source_key = str(run.get("data.reward_fn_key") or "data_source")
    try:  # the schema and the one column read, not the whole file
        file = pq.ParquetFile(source())
        schema = file.schema_arrow
    except Exception as error:  # noqa: BLE001 pyarrow's own message says what is wrong with the file
        reason = " ".join(str(error).split())
        return [problem_line(KEY, value, f"{name} is not a readable parquet file ({reason}).")]
    if missing := _columns(schema, prompt_key, source_key):
        return [problem_line(KEY, value, f"{name} lacks what verl reads: {', '.join(missing)} (columns "
                             f"{prompt_key}, {source_key}, reward_model.ground_truth; extra_info optional).")]
    if file.metadata.num_rows == 0:
        return [problem_line(KEY, value, f"{name} has no rows.")]
    batch = int(run.get("data.train_batch_size"))
    if name == FILES["data.train_files"] and file.metadata.num_rows < batch:
        return [problem_line(KEY, value, f"{name} has {file.metadata.num_rows} rows, fewer than "
                             f"verl.data.train_batch_size = {batch} (verl drops the last partial batch and stops: "
                             "'Train dataloader is empty!'); add rows or lower it.")]
    if run.get(CUSTOM_REWARD) or not read_sources:
        return []
    names, prefixes = known_sources(release)
    seen = sorted({str(s) for s in pc.unique(file.read(columns=[source_key]).column(source_key)).to_pylist()})
    unknown = [s for s in seen if s not in names and not s.startswith(prefixes)]
    if not unknown:
        return []
    more = len(unknown) - _SHOWN
    shown = ", ".join(unknown[:_SHOWN]) + (f" and {more} more" if more > 0 else "")
    return [problem_line(KEY, value, f"{name}: {source_key} {shown} is not one verl {release.version}'s "
                         f"default reward scores ({', '.join(sorted(names)[:8])}, ...); set "
                         "verl-gke:rewardFunction for your own (checked and uploaded).")]

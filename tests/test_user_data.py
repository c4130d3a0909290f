"""Your own data (issue 49, item 2): verl-gke:dataDir, a local folder in verl's parquet format, checked offline
and uploaded by the program into the bucket under its digest."""

from __future__ import annotations

import functools
import json
import random
import shlex
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from domain import preflight, user_data
from domain.config import ConfigError, load_config
from domain.platforms import PLATFORMS
from tests.conftest import BASE_CONFIG, verl_value
from verl_gke import synth

KEY = "verl-gke:dataDir"


def row(source: str = "openai/gsm8k", **extra: Any) -> dict[str, Any]:
    """One row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {"data_source": source, "prompt": [{"role": "user", "content": "1 + 1?"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"split": "train", "index": 0},
            **extra}


BATCH = 256
"""verl-gke's data.train_batch_size: train.parquet needs at least a batch of rows."""


def batch_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` cycled to a whole batch (each row's first index unchanged)."""
    return [rows[i % len(rows)] for i in range(max(len(rows), BATCH))] if rows else rows


def write(folder: Path, rows: list[dict[str, Any]], drop: tuple[str, ...] = (),
          test: list[dict[str, Any]] | None = None, train_rows: int | None = None) -> Path:
    """train.parquet: `rows` cycled to `train_rows` (default a batch); test.parquet: `test`, default `rows`."""
    folder.mkdir(parents=True, exist_ok=True)
    train = batch_of(rows) if train_rows is None else [rows[i % len(rows)] for i in range(train_rows)]
    for name, part in (("train.parquet", train), ("test.parquet", rows if test is None else test)):
        table = pa.Table.from_pylist([{k: v for k, v in r.items() if k not in drop} for r in part],
                                     schema=None if part else pa.Table.from_pylist(rows).schema)
        pq.write_table(table, folder / name)
    return folder


def refused(**config: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, **config})
    return caught.value.problems


def test_good_data_sets_the_run_paths_under_its_digest(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row(), row("lighteval/MATH"), row("aime2024")])
    cfg = load_config({**BASE_CONFIG, KEY: str(folder)})
    d = user_data.digest(folder)
    assert cfg.verl.get("data.train_files") == f"/data/user-data/{d}/train.parquet"
    assert cfg.verl.get("data.val_files") == f"/data/user-data/{d}/test.parquet"


def test_missing_columns_are_named_in_one_line_per_file(tmp_path: Path) -> None:
    folder = write(tmp_path / "bad", [row()], drop=("reward_model", "data_source"))
    line = (f'verl-gke:dataDir = "{folder}": {{}} lacks what verl reads: data_source, reward_model (columns prompt, '
            "data_source, reward_model.ground_truth; extra_info optional).")
    assert refused(**{KEY: str(folder)}) == [line.format("train.parquet"), line.format("test.parquet")]


def test_a_ground_truth_outside_reward_model_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path / "flat", [row(reward_model={"style": "rule", "answer": "2"})])
    [first, _] = refused(**{KEY: str(folder)})
    assert first.endswith("train.parquet lacks what verl reads: reward_model.ground_truth (columns prompt, "
                          "data_source, reward_model.ground_truth; extra_info optional).")


def test_sources_verls_default_reward_does_not_score_are_refused_unless_a_custom_reward_is_set(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row("my/source"), row("openai/gsm8k")])
    lines = refused(**{KEY: str(folder)})
    assert len(lines) == 2 and lines[0].startswith(
        f'verl-gke:dataDir = "{folder}": train.parquet: data_source my/source is not one verl 0.6.1\'s default '
        "reward scores (")
    assert lines[0].endswith("...); set verl-gke:rewardFunction for your own (checked and uploaded).")
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    load_config({**BASE_CONFIG, KEY: str(folder), "verl-gke:rewardFunction": str(reward)})


def test_a_folder_without_the_files_is_refused(tmp_path: Path) -> None:
    assert refused(**{KEY: str(tmp_path)}) == [
        f'verl-gke:dataDir = "{tmp_path}": a folder holding train.parquet and test.parquet in verl\'s RL format '
        "(missing train.parquet, test.parquet)."]


def test_the_data_paths_may_not_be_set_twice(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()])
    assert refused(**{KEY: str(folder), "verl-gke:verl": verl_value({"data.train_files": "/data/x.parquet"})}) == [
        f'verl-gke:dataDir = "{folder}": sets data.train_files itself: remove verl-gke:verl.data.train_files, or '
        "this key."]


def test_the_sources_are_read_from_the_pinned_verls_reward_function() -> None:
    names, prefixes = user_data.known_sources(PLATFORMS["a4"].verl)
    assert {"openai/gsm8k", "lighteval/MATH", "math_dapo"} <= names and "aime" in prefixes


def test_the_program_uploads_the_files_and_the_job_reads_them(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()])
    result = synth.run("a4", overrides={KEY: str(folder)})
    d = user_data.digest(folder)
    objects = {r.inputs["name"]: r for r in result.registrations if r.type == "gcp:storage/bucketObject:BucketObject"}
    assert set(objects) == {f"user-data/{d}/train.parquet", f"user-data/{d}/test.parquet"}
    [job] = [r for r in result.registrations if r.type == "pulumi-python:dynamic:GrpoJob"]
    args = shlex.split(job.inputs["entrypoint"])
    assert f"data.train_files=/data/user-data/{d}/train.parquet" in args
    assert f"data.val_files=/data/user-data/{d}/test.parquet" in args


def test_a_file_that_is_not_parquet_is_refused_with_pyarrows_reason(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()])
    (folder / "train.parquet").write_text("prompt,data_source\n")
    [line] = refused(**{KEY: str(folder)})
    assert line.startswith(f'verl-gke:dataDir = "{folder}": train.parquet is not a readable parquet file (')
    assert "\n" not in line


# gs:// data (issue 49, item 2): pinned by generation in the stack file, checked at preview from the footers.
GS = "gs://their-data/rl/#train.parquet=1700000000000001,test.parquet=1700000000000002"


def gs_cfg(tmp_path: Path, value: str = GS, **verl: Any) -> Any:
    """A stack whose dataDir is `value` (load_config refuses gs:// until staging copies it: set after loading)."""
    cfg = load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(verl)} if verl else BASE_CONFIG)
    return cfg.model_copy(update={"data_dir": value})


def answers(objects: dict[str, int]) -> Any:
    """getBucketObject as the gcp provider answers it (pulumi-gcp storage.getBucketObject: `generation` among the
    object's metadata); a missing object fails the invoke with GCS's 404 in the provider's words."""
    def invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
        assert token == preflight.BUCKET_OBJECT and args["bucket"] == "their-data"
        if args["name"] not in objects:
            raise RuntimeError(f"invoke of {token} failed: googleapi: Error 404: No such object: "
                               f"their-data/{args['name']}, notFound")
        return {"name": args["name"], "generation": str(objects[args["name"]]), "md5hash": "x"}
    return invoke


class Objects:
    """GCS's objects.get (`size`) and media reads with a byte Range, of the generations it holds; the ranges
    asked are kept."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.read_bytes = files, 0

    def __call__(self, bucket: str, name: str, generation: int) -> tuple[int, Any]:
        data = self.files[f"{name}#{generation}"]

        def read(start: int, length: int) -> bytes:
            self.read_bytes += length
            return data[start:start + length]
        return len(data), read


def parquet_bytes(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k not in drop} for r in rows]), sink)
    return sink.getvalue().to_pybytes()


PINNED = {"rl/train.parquet": 1700000000000001, "rl/test.parquet": 1700000000000002}


def check(cfg: Any, objects: dict[str, int], files: dict[str, bytes]) -> preflight.PreflightResult:
    result = preflight.PreflightResult()
    preflight.gs_data_check(cfg, answers(objects), Objects(files), result)
    return result


def good_files(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> dict[str, bytes]:
    return {f"{name}#{gen}": parquet_bytes(batch_of(rows) if name.endswith("train.parquet") else rows, drop)
            for name, gen in PINNED.items()}


def test_gs_data_pinned_and_well_formed_passes_preview(tmp_path: Path) -> None:
    result = check(gs_cfg(tmp_path), PINNED, good_files([row()] * 3000))
    assert result.problems == [] and result.checks == [
        "dataDir: the gs:// objects are at their pinned generations and hold the columns and data_source values "
        "verl reads"]


def test_gs_data_sets_the_run_paths_under_the_digest_of_its_pins() -> None:
    other = GS.replace("=1700000000000002", "=1700000000000003")
    d, e = user_data.digest(GS), user_data.digest(other)
    assert d != e and user_data.verl_paths(GS) == {"data.train_files": f"/data/user-data/{d}/train.parquet",
                                                   "data.val_files": f"/data/user-data/{d}/test.parquet"}


def test_a_missing_gs_object_is_named(tmp_path: Path) -> None:
    result = check(gs_cfg(tmp_path), {"rl/train.parquet": 1700000000000001}, good_files([row()]))
    assert result.problems == [f'verl-gke:dataDir = "{GS}": no object gs://their-data/rl/test.parquet: upload it, '
                               "or name the prefix that holds it."]


def test_wrong_columns_are_read_from_the_real_footer(tmp_path: Path) -> None:
    result = check(gs_cfg(tmp_path), PINNED, good_files([row()], drop=("reward_model",)))
    line = (f'verl-gke:dataDir = "{GS}": {{}} lacks what verl reads: reward_model (columns prompt, data_source, '
            "reward_model.ground_truth; extra_info optional).")
    assert result.problems == [line.format("train.parquet"), line.format("test.parquet")]


def test_gs_data_sources_are_checked_from_their_column_alone(tmp_path: Path) -> None:
    noise = random.Random(0)  # prompts that do not compress: the file is megabytes, its data_source column not
    rows = [row("my/source", prompt=[{"role": "user", "content": noise.randbytes(400).hex()}]) for _ in range(4000)]
    files = good_files(rows)
    objects = Objects(files)
    result = preflight.PreflightResult()
    preflight.gs_data_check(gs_cfg(tmp_path), answers(PINNED), objects, result)
    assert result.problems[0].startswith(f'verl-gke:dataDir = "{GS}": train.parquet: data_source my/source is not '
                                         "one verl 0.6.1's default reward scores (")
    assert len(result.problems) == 2 and objects.read_bytes < sum(map(len, files.values())) / 10


def test_an_unreadable_gs_object_is_one_line(tmp_path: Path) -> None:
    def denied(bucket: str, name: str, generation: int) -> Any:
        raise OSError("HTTP Error 403: Forbidden")
    result = preflight.PreflightResult()
    preflight.gs_data_check(gs_cfg(tmp_path), answers(PINNED), denied, result)
    assert result.problems == [f'verl-gke:dataDir = "{GS}": gs://their-data/rl/{name} could not be read with your '
                               "credentials: HTTP Error 403: Forbidden" for name in ("train.parquet", "test.parquet")]


def test_a_changed_generation_is_refused_with_both_and_the_fix(tmp_path: Path) -> None:
    result = check(gs_cfg(tmp_path), {**PINNED, "rl/train.parquet": 1700000000000009}, good_files([row()]))
    new = GS.replace("train.parquet=1700000000000001", "train.parquet=1700000000000009")
    assert result.problems == [
        f'verl-gke:dataDir = "{GS}": gs://their-data/rl/train.parquet changed: the stack pins generation '
        f"1700000000000001, the bucket holds 1700000000000009; to train on the new object set verl-gke:dataDir to "
        f"{new} (new data, a new run), or restore generation 1700000000000001."]


def test_an_unpinned_gs_path_is_refused_with_how_to_pin_it() -> None:
    assert refused(**{KEY: "gs://b/data"}) == [
        'verl-gke:dataDir = "gs://b/data": gs://BUCKET/PREFIX/#train.parquet=GENERATION,test.parquet=GENERATION, '
        'each object pinned by its generation (read it with `gcloud storage objects describe '
        'gs://b/data/train.parquet --format="value(generation)"`), or a local folder.']


def test_the_stand_in_checks_nothing(tmp_path: Path) -> None:
    cfg = gs_cfg(tmp_path)
    result = preflight.PreflightResult()
    preflight.gs_data_check(cfg, preflight.healthy_answers(cfg), Objects({}), result)
    assert result.problems == [] and result.checks == []


def test_gs_data_is_copied_by_staging_and_read_by_the_job() -> None:
    result = synth.run("a4", overrides={KEY: GS})
    d = user_data.digest(GS)
    assert not [r for r in result.registrations if r.type == "gcp:storage/bucketObject:BucketObject"]
    [job] = [r for r in result.registrations if r.type == "kubernetes:batch/v1:Job"
             and r.inputs["metadata"]["name"] == "stage-data"]
    args = job.inputs["spec"]["template"]["spec"]["containers"][0]["command"]
    at = args.index("--bucket")
    assert args[at:] == [
        "--bucket", args[at + 1], "--user-data", f"gs://their-data/rl/train.parquet#1700000000000001="
        f"user-data/{d}/train.parquet", "--user-data",
        f"gs://their-data/rl/test.parquet#1700000000000002=user-data/{d}/test.parquet"]
    [grpo] = [r for r in result.registrations if r.type == "pulumi-python:dynamic:GrpoJob"]
    assert f"data.train_files=/data/user-data/{d}/train.parquet" in shlex.split(grpo.inputs["entrypoint"])


def test_the_preview_reader_reads_ranges_of_the_pinned_generation(gcs_emulator: str, tmp_path: Path) -> None:
    from components.preflight import open_gcs_object
    from tests.gcs_emulator import make_bucket

    theirs = make_bucket(gcs_emulator, "their-data", tmp_path)
    data = parquet_bytes(batch_of([row("my/source")]))
    generations = {name: theirs.write(name, data, 0) for name in PINNED}
    value = GS.replace("1700000000000001", str(generations["rl/train.parquet"])).replace(
        "1700000000000002", str(generations["rl/test.parquet"]))
    size, read = open_gcs_object("their-data", "rl/train.parquet", generations["rl/train.parquet"],
                                 root=gcs_emulator, token="emulator")
    assert size == len(data) and read(size - 12, 12) == data[-12:] and read(4, 8) == data[4:12]
    result = preflight.PreflightResult()
    reader = functools.partial(open_gcs_object, root=gcs_emulator, token="emulator")
    preflight.gs_data_check(gs_cfg(tmp_path, value), answers(generations), reader, result)
    assert [line.split(": ", 2)[1] for line in result.problems] == [
        "train.parquet", "test.parquet"] and "data_source my/source" in result.problems[0]


def test_math_is_staged_by_its_recipe_and_read_by_the_job() -> None:
    result = synth.run("a4", overrides={"verl-gke:dataset": "DigitalLearningGmbH/MATH-lighteval",
                                        "verl-gke:verl": verl_value({"data.filter_overlong_prompts": True})})
    [job] = [r for r in result.registrations if r.type == "kubernetes:batch/v1:Job"
             and r.inputs["metadata"]["name"] == "stage-data"]
    args = job.inputs["spec"]["template"]["spec"]["containers"][0]["command"]
    at = args.index("--dataset-repo")
    assert args[at:at + 6] == ["--dataset-repo", "DigitalLearningGmbH/MATH-lighteval", "--dataset-config", "data",
                               "--dataset-revision", "0530c78699ea5e8eb5530600900e1f328b48acad"]
    [grpo] = [r for r in result.registrations if r.type == "pulumi-python:dynamic:GrpoJob"]
    entrypoint = shlex.split(grpo.inputs["entrypoint"])
    assert "data.train_files=/data/math/train.parquet" in entrypoint
    assert "data.val_files=/data/math/test.parquet" in entrypoint


# The reward on your gs:// rows (issue 49): at preview, as verl's reward manager calls it, not on a GSM8K row at synth.
PICKY = ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
         "    assert data_source == 'my/source', data_source\n"
         "    assert extra_info['index'] >= 0 and extra_info['num_turns'] is None\n"
         "    return float(solution_str == ground_truth)\n")


def picky_cfg(tmp_path: Path) -> Any:
    path = tmp_path / "reward.py"
    path.write_text(PICKY)
    return load_config({**BASE_CONFIG, KEY: GS, "verl-gke:rewardFunction": str(path)}), path


def test_a_reward_for_your_gs_rows_alone_passes_synth(tmp_path: Path) -> None:
    cfg, path = picky_cfg(tmp_path)
    assert cfg.reward_function == str(path)


def test_the_reward_is_called_on_your_gs_rows_at_preview(tmp_path: Path) -> None:
    cfg, _ = picky_cfg(tmp_path)
    rows = [row("my/source", extra_info={"split": "train", "index": i}) for i in range(3)]
    result = check(cfg, PINNED, good_files(rows))
    assert result.problems == [] and result.checks[-1] == (
        "rewardFunction: called on one row per data_source of each gs:// file's first row group")


def test_a_reward_failing_on_one_of_your_gs_rows_is_one_line_naming_it(tmp_path: Path) -> None:
    cfg, path = picky_cfg(tmp_path)
    rows = [row("my/source", extra_info={"split": "train", "index": 0}),
            row("their/source", extra_info={"split": "train", "index": 1})]
    result = check(cfg, PINNED, good_files(rows))
    assert result.problems == [
        f'verl-gke:rewardFunction = "{path}": compute_score raised AssertionError: their/source on row 1 of '
        "gs://their-data/rl/train.parquet (data_source their/source)."]


def test_a_row_group_too_large_to_read_is_said_and_not_called(tmp_path: Path) -> None:
    cfg, _ = picky_cfg(tmp_path)
    noise = random.Random(1)
    rows = [row("their/source", extra_info={"split": noise.randbytes(3000).hex(), "index": 0}) for _ in range(2000)]
    objects = Objects(good_files(rows))
    result = preflight.PreflightResult()
    preflight.gs_data_check(cfg, answers(PINNED), objects, result)
    assert result.problems == [] and result.notes == [
        "rewardFunction: NOT CHECKED on gs://their-data/rl/train.parquet: its first row group's data_source, "
        "reward_model and extra_info take 12.0 MB, over the 8 MB preview reads",
        "rewardFunction: NOT CHECKED on gs://their-data/rl/test.parquet: its first row group's data_source, "
        "reward_model and extra_info take 12.0 MB, over the 8 MB preview reads"]
    assert objects.read_bytes < 1_000_000


# Staging's read grant on your bucket (issue 49), read at preview from the bucket's IAM policy (pulumi-gcp
# storage.getBucketIamPolicy's policyData: the JSON of GCS's Policy, bindings of role, members and condition).
POOL = "principal://iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/{}.svc.id.goog"
STAGING = POOL + "/subject/ns/verl-gke/sa/verl-ray-dev-staging"


def grants(bucket: list[dict[str, Any]] | None, project: list[dict[str, Any]] | None = None,
           uniform: bool = True) -> Any:
    """The gcp provider's answers to the three reads; a policy given as None fails its invoke with a 403."""
    def invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
        if token == preflight.BUCKET_IAM:
            assert args == {"bucket": "their-data"}
            policy = bucket
        elif token == preflight.BUCKET:
            assert args == {"name": "their-data"}
            return {"name": "their-data", "projectNumber": 987, "uniformBucketLevelAccess": uniform}
        else:
            assert token == preflight.PROJECT_IAM and args == {"project": "987"}
            policy = project
        if policy is None:
            raise RuntimeError(f"invoke of {token} failed: googleapi: Error 403: denied, forbidden")
        return {"policyData": json.dumps({"bindings": policy}), "etag": "x"}
    return invoke


def read_check(cfg: Any, invoke: Any) -> preflight.PreflightResult:
    result = preflight.PreflightResult()
    preflight.staging_read_check(cfg, invoke, "dev", result)
    return result


@pytest.mark.parametrize("member", [STAGING, "allUsers",
                                    POOL.replace("principal:", "principalSet:") + "/namespace/verl-gke"])
def test_a_read_grant_to_staging_on_your_bucket_passes(tmp_path: Path, member: str) -> None:
    result = read_check(gs_cfg(tmp_path), grants([{"role": "roles/storage.objectViewer",
                                                   "members": [member.format("my-project-123")]}]))
    assert result.problems == [] and result.notes == [] and result.checks == [
        "dataDir: staging's identity may read the gs:// bucket"]


def test_no_read_grant_on_the_bucket_or_its_project_is_said_with_the_grant_line_and_not_refused(tmp_path: Path) -> None:
    # A folder's or the organization's policy may grant it, and no invoke reads those: never refused.
    other = STAGING.format("my-project-123").replace("verl-ray-dev", "someone")
    result = read_check(gs_cfg(tmp_path), grants([{"role": "roles/storage.objectViewer", "members": [other]},
                                                  {"role": "roles/storage.objectCreator",
                                                   "members": [STAGING.format("my-project-123")]}], project=[]))
    assert result.problems == [] and result.checks == []
    assert result.notes == [
        "dataDir: NOT CHECKED that staging may read gs://their-data: neither the bucket's IAM policy nor its project's "
        "grants staging (Kubernetes service account verl-ray-dev-staging in namespace verl-gke) storage.objects.get, "
        "and grants on a folder or the organization are not read; unless one of those grants it, staging fails at "
        "its start: grant it with `gcloud storage buckets add-iam-policy-binding gs://their-data "
        "--role=roles/storage.objectViewer --member=principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/"
        "global/workloadIdentityPools/my-project-123.svc.id.goog/subject/ns/verl-gke/sa/verl-ray-dev-staging`"]


@pytest.mark.parametrize(("bucket", "project", "uniform", "why"), [
    (None, [], True, "the bucket's IAM policy could not be read: googleapi: Error 403: denied, forbidden"),
    ([{"role": "projects/p/roles/reader", "members": [STAGING.format("my-project-123")]}], [], True,
     "custom role projects/p/roles/reader may or may not hold storage.objects.get"),
    ([{"role": "roles/storage.objectViewer", "members": [STAGING.format("my-project-123")],
       "condition": {"expression": "true"}}], [], True, "the grant of roles/storage.objectViewer has a condition"),
    ([], None, True, "its project's IAM policy could not be read: googleapi: Error 403: denied, forbidden"),
    ([], [], False, "the bucket has fine-grained access: its object ACLs may grant it"),
    ([{"role": "roles/storage.objectViewer", "members": ["allAuthenticatedUsers"]}], [], True,
     "the bucket's IAM policy grants roles/storage.objectViewer to all authenticated users or Kubernetes identities "
     "by UID or cluster"),
    ([], [{"role": "roles/viewer", "members": [STAGING.format("my-project-123")]}], True,
     "role roles/viewer may or may not hold storage.objects.get"),
])
def test_a_grant_that_cannot_be_decided_is_not_checked_and_not_refused(
        tmp_path: Path, bucket: Any, project: Any, uniform: bool, why: str) -> None:
    result = read_check(gs_cfg(tmp_path), grants(bucket, project, uniform))
    assert result.problems == [] and result.checks == [] and result.notes == [
        f"dataDir: NOT CHECKED that staging may read gs://their-data: {why}"]


def test_a_read_grant_on_the_bucket_project_counts(tmp_path: Path) -> None:
    result = read_check(gs_cfg(tmp_path), grants([], [{"role": "roles/storage.objectUser",
                                                        "members": [STAGING.format("my-project-123")]}]))
    assert result.problems == [] and result.checks == ["dataDir: staging's identity may read the gs:// bucket"]


def test_preview_checks_the_grant(tmp_path: Path) -> None:
    cfg = gs_cfg(tmp_path)
    healthy, ours = preflight.healthy_answers(cfg), grants([], [])
    result = preflight.run_preflight(cfg, lambda token, args: (ours if token in (
        preflight.BUCKET_IAM, preflight.BUCKET, preflight.PROJECT_IAM) else healthy)(token, args), "dev")
    assert result.problems == []
    assert [n[:60] for n in result.notes if "staging may read" in n] == [
        "dataDir: NOT CHECKED that staging may read gs://their-data: "]


# Data size (issue 49): verl's train loader drops the last partial batch and stops with 'Train dataloader is empty!'
# (verl/trainer/ppo/ray_trainer.py, 0.6.1 and 0.9.0) when train.parquet holds fewer rows than data.train_batch_size.
def test_a_train_file_smaller_than_a_batch_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()], train_rows=200)
    assert refused(**{KEY: str(folder)}) == [
        f'{KEY} = "{folder}": train.parquet has 200 rows, fewer than verl.data.train_batch_size = 256 (verl '
        "drops the last partial batch and stops: 'Train dataloader is empty!'); add rows or lower it."]


def test_an_empty_test_file_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path / "mine", [row()], test=[])
    assert refused(**{KEY: str(folder)}) == [f'{KEY} = "{folder}": test.parquet has no rows.']


def test_a_gs_train_file_smaller_than_a_batch_is_refused_at_preview(tmp_path: Path) -> None:
    files = {f"{name}#{gen}": parquet_bytes([row()] * 100) for name, gen in PINNED.items()}
    assert check(gs_cfg(tmp_path), PINNED, files).problems == [
        f'{KEY} = "{GS}": train.parquet has 100 rows, fewer than verl.data.train_batch_size = 256 (verl drops the '
        "last partial batch and stops: 'Train dataloader is empty!'); add rows or lower it."]


def test_a_local_folders_rows_give_the_modeled_steps_and_validation_prompts(tmp_path: Path) -> None:
    from domain.verl_config import verl_run_check

    folder = write(tmp_path / "mine", [row()], test=[row()] * 300, train_rows=1000)
    problems, plan = verl_run_check(load_config({**BASE_CONFIG, KEY: str(folder)}))
    assert problems == [] and plan is not None
    assert (plan.steps, plan.time.shape.validation_prompts) == (1000 // 256 * 2, 300)  # 2 epochs, partial dropped
    # Its token lengths are not read offline: the default dataset's stand in, and the line says so.
    assert "tokens a sequence (128 prompt + 320 response; openai/gsm8k's, assumed for verl-gke:dataDir)" in (
        plan.time.lines(None)[1])

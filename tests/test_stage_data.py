"""The staging program on a tiny GSM8K-like dataset and model the tests write themselves (no network).

The Hub is replaced by a directory of files (`DirHub`); everything else, parquet included, is real.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import urllib.error
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from domain import staged
from workloads import stage_data as sd

SCRIPT = Path(sd.__file__)
DATASET = "openai/gsm8k"
MODEL = "Qwen/Qwen2.5-32B-Instruct"
REV_A = "a" * 40
REV_B = "b" * 40
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

RAW_TRAIN = [
    ("Tom has 3 apples and buys 4 more. How many?", "3 + 4 = <<3+4=7>>7\n#### 7"),
    ("A farm sells 1,200 eggs a day. Eggs in 2 days?", "1200 * 2 = <<1200*2=2400>>2400\n#### 2,400"),
    ("The temperature drops 5 degrees from 2. What is it now?", "2 - 5 = <<2-5=-3>>-3\n#### -3"),
]
RAW_TEST = [("Half of 9?", "9 / 2 = <<9/2=4.5>>4.5\n#### 4.5")]


class RepositoryNotFoundError(Exception):
    """Named as huggingface_hub.errors' class, which is what the classifier reads."""


class DirHub:
    """A Hub made of local files: repos[(type, repo, revision)] = {repo path: bytes}."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str, str], dict[str, bytes]] = {}
        self.calls: list[str] = []
        self.fail: Exception | None = None

    def list_files(self, repo: str, repo_type: str, revision: str) -> dict[str, int]:
        self.calls.append(f"list {repo_type} {repo}@{revision}")
        if self.fail is not None:
            raise self.fail
        return {name: len(data) for name, data in self.repos[(repo_type, repo, revision)].items()}

    def download(self, repo: str, repo_type: str, revision: str, filename: str, local_dir: Path) -> Path:
        self.calls.append(f"get {repo_type} {repo}@{revision} {filename}")
        target = local_dir / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.repos[(repo_type, repo, revision)][filename])
        return target


def _parquet_bytes(rows: list[tuple[str, str]], tmp_path: Path) -> bytes:
    path = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"question": [q for q, _ in rows], "answer": [a for _, a in rows]}), path)
    return path.read_bytes()


@pytest.fixture
def hub(tmp_path: Path) -> DirHub:
    h = DirHub()
    gsm8k = {
        "README.md": b"gsm8k",
        "main/train-00000-of-00001.parquet": _parquet_bytes(RAW_TRAIN, tmp_path),
        "main/test-00000-of-00001.parquet": _parquet_bytes(RAW_TEST, tmp_path),
        "socratic/train-00000-of-00001.parquet": b"not this config",
    }
    h.repos[("dataset", DATASET, REV_A)] = gsm8k
    h.repos[("dataset", DATASET, REV_B)] = gsm8k
    model = {
        "config.json": b'{"model_type": "qwen2"}',
        "model-00001-of-00002.safetensors": b"x" * 3000,
        "model-00002-of-00002.safetensors": b"y" * 2000,
        "tokenizer/vocab.json": b"{}",
    }
    h.repos[("model", MODEL, REV_A)] = model
    h.repos[("model", MODEL, REV_B)] = {**model, "config.json": b'{"model_type": "qwen2", "v": 2}'}
    return h


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


# --- ground truth and rows ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("lots of steps\n#### 1,200", "1200"),
        ("#### 1,234,567", "1234567"),
        ("it drops\n#### -3", "-3"),
        ("#### -1,000", "-1000"),
        ("#### 4.5", "4.5"),
        ("####12", "12"),
    ],
)
def test_ground_truth_is_the_number_after_the_hashes(answer: str, truth: str) -> None:
    assert sd.extract_answer(answer) == truth


def test_answer_without_hashes_is_rejected() -> None:
    with pytest.raises(ValueError, match="####"):
        sd.extract_answer("the answer is 7")


def test_row_has_verls_gsm8k_format() -> None:
    assert sd.gsm8k_row(question="What is 2+2?", answer="2+2=4\n#### 4", split="train", index=5) == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2+2? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 5, "answer": "2+2=4\n#### 4", "question": "What is 2+2?"},
    }


def test_split_files_pick_one_config_and_split() -> None:
    files = [
        "README.md",
        "main/test-00000-of-00001.parquet",
        "main/train-00001-of-00002.parquet",
        "main/train-00000-of-00002.parquet",
        "socratic/train-00000-of-00001.parquet",
        "main/train-00000-of-00001.parquet.lock",
    ]
    assert sd.split_files(files, "main", "train") == [
        "main/train-00000-of-00002.parquet",
        "main/train-00001-of-00002.parquet",
    ]
    assert sd.split_files(files, "main", "validation") == []


def test_model_dir_is_the_repo_name() -> None:
    assert sd.model_dir_for("Qwen/Qwen2.5-32B-Instruct") == "Qwen2.5-32B-Instruct"


# --- the dataset, end to end on a tiny parquet --------------------------------------------------


def test_dataset_is_written_in_verls_schema_and_rows(hub: DirHub, data_root: Path) -> None:
    assert sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=data_root / "gsm8k") is True

    train = pq.read_table(data_root / "gsm8k" / "train.parquet")
    assert train.schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert train.schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert train.schema.field("reward_model").type == pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
    assert train.schema.field("extra_info").type == pa.struct(
        [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
    )
    assert train.schema.field("data_source").type == pa.string()
    assert train.schema.field("ability").type == pa.string()

    rows = train.to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "2400", "-3"]
    assert rows[1] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "A farm sells 1,200 eggs a day. Eggs in 2 days? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2400"},
        "extra_info": {
            "split": "train",
            "index": 1,
            "answer": RAW_TRAIN[1][1],
            "question": RAW_TRAIN[1][0],
        },
    }
    test = pq.read_table(data_root / "gsm8k" / "test.parquet").to_pylist()
    assert [(r["extra_info"]["split"], r["extra_info"]["index"], r["reward_model"]["ground_truth"]) for r in test] == [
        ("test", 0, "4.5")
    ]
    assert sorted(p.name for p in (data_root / "gsm8k").iterdir()) == [
        ".verl-gke-staged.json",
        "test.parquet",
        "train.parquet",
    ]


def test_dataset_marker_records_revision_fingerprint_and_sizes(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "gsm8k"
    sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=dest)
    marker = json.loads((dest / ".verl-gke-staged.json").read_text())
    assert marker == {
        "kind": "dataset",
        "repo": DATASET,
        "config": "main",
        "revision": REV_A,
        "fingerprint": sd.dataset_fingerprint(DATASET, "main", REV_A),
        "files": {
            "test.parquet": (dest / "test.parquet").stat().st_size,
            "train.parquet": (dest / "train.parquet").stat().st_size,
        },
    }


def test_fingerprint_changes_with_revision_and_config() -> None:
    base = sd.dataset_fingerprint(DATASET, "main", REV_A)
    assert len(base) == 16
    assert base == sd.dataset_fingerprint(DATASET, "main", REV_A)
    assert base != sd.dataset_fingerprint(DATASET, "main", REV_B)
    assert base != sd.dataset_fingerprint(DATASET, "socratic", REV_A)


def test_second_dataset_run_touches_nothing(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "gsm8k"
    sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=dest)
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    hub.calls.clear()
    assert sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=dest) is False
    assert hub.calls == []
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == before


def test_new_dataset_revision_restages(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "gsm8k"
    sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=dest)
    assert sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_B, dest=dest) is True
    assert json.loads((dest / ".verl-gke-staged.json").read_text())["revision"] == REV_B


def test_deleted_output_restages(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "gsm8k"
    sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=dest)
    (dest / "train.parquet").unlink()
    assert sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=dest) is True
    assert pq.read_table(dest / "train.parquet").num_rows == 3


def test_dataset_without_the_split_fails_permanently(hub: DirHub, data_root: Path) -> None:
    with pytest.raises(sd.StagingError, match=r"has no main/test-\*\.parquet") as e:
        hub.repos[("dataset", DATASET, REV_A)].pop("main/test-00000-of-00001.parquet")
        sd.stage_dataset(hub, repo=DATASET, config="main", revision=REV_A, dest=data_root / "gsm8k")
    assert e.value.permanent
    assert not (data_root / "gsm8k" / ".verl-gke-staged.json").exists()


def test_rows_without_answer_column_fail_with_the_source_named() -> None:
    with pytest.raises(sd.StagingError) as e:
        sd.transform_table(pa.table({"question": ["q"]}), "train", source="src")
    assert str(e.value) == "src has columns ['question'], lacks ['answer']: not a GSM8K split"
    assert e.value.permanent


def test_row_without_hashes_names_its_index() -> None:
    table = pa.table({"question": ["q0", "q1"], "answer": ["#### 1", "no final answer"]})
    with pytest.raises(sd.StagingError, match=r"^src row 1: no \"#### <number>\" in the answer$"):
        sd.transform_table(table, "train", source="src")


# --- the skip decision --------------------------------------------------------------------------


IDENTITY = {"kind": "model", "repo": MODEL, "revision": REV_A}


def test_decide_without_marker_stages() -> None:
    assert sd.decide(None, IDENTITY, {}.get) == sd.Decision(False, "nothing staged yet")


def test_decide_with_other_revision_stages() -> None:
    marker = sd.make_marker({**IDENTITY, "revision": REV_B}, {"a": 1})
    want = sd.Decision(False, f"staged revision is {REV_B!r}, want {REV_A!r}")
    assert sd.decide(marker, IDENTITY, {"a": 1}.get) == want


def test_decide_with_missing_or_short_file_stages() -> None:
    marker = sd.make_marker(IDENTITY, {"a": 1, "b": 2})
    assert sd.decide(marker, IDENTITY, {"a": 1}.get) == sd.Decision(False, "b is missing")
    assert sd.decide(marker, IDENTITY, {"a": 1, "b": 1}.get) == sd.Decision(False, "b has 1 bytes, marker says 2")


def test_decide_with_empty_file_list_stages() -> None:
    assert sd.decide({**IDENTITY, "files": {}}, IDENTITY, {}.get) == sd.Decision(False, "marker lists no files")


def test_decide_skips_when_all_is_there() -> None:
    marker = sd.make_marker(IDENTITY, {"a": 1500, "b": 2})
    assert sd.decide(marker, IDENTITY, {"a": 1500, "b": 2}.get) == sd.Decision(True, "already staged (2 files, 1.5 KB)")


def test_marker_round_trip_and_unreadable_marker(tmp_path: Path) -> None:
    path = tmp_path / sd.MARKER_NAME
    assert sd.read_marker(path) is None
    sd.write_marker(path, sd.make_marker(IDENTITY, {"b": 2, "a": 1}))
    assert sd.read_marker(path) == {**IDENTITY, "files": {"a": 1, "b": 2}}
    assert not path.with_name(path.name + ".tmp").exists()
    path.write_text("{not json")
    assert sd.read_marker(path) is None
    path.write_text("[1, 2]")
    assert sd.read_marker(path) is None


# --- the model ----------------------------------------------------------------------------------


def test_model_is_downloaded_with_progress_and_marker(
    hub: DirHub, data_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dest = data_root / "Qwen2.5-32B-Instruct"
    with caplog.at_level(logging.INFO, logger="stage-data"):
        assert sd.stage_model(hub, repo=MODEL, revision=REV_A, dest=dest, workers=2) is True
    assert (dest / "model-00001-of-00002.safetensors").read_bytes() == b"x" * 3000
    assert (dest / "tokenizer" / "vocab.json").read_bytes() == b"{}"
    marker = json.loads((dest / ".verl-gke-staged.json").read_text())
    assert marker == {
        "kind": "model",
        "repo": MODEL,
        "revision": REV_A,
        "files": {
            "config.json": 23,
            "model-00001-of-00002.safetensors": 3000,
            "model-00002-of-00002.safetensors": 2000,
            "tokenizer/vocab.json": 2,
        },
    }
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model: ")]
    assert progress[0] == "model: 4 files, 5.0 KB to fetch with 2 workers"
    assert [line.split(", ")[0] for line in progress[1:]] == [f"model: {i}/4 files" for i in range(1, 5)]
    assert progress[-1].startswith("model: 4/4 files, 5.0 KB/5.0 KB (100%), ")
    # Largest shard first.
    assert hub.calls[1] == f"get model {MODEL}@{REV_A} model-00001-of-00002.safetensors"


def test_second_model_run_costs_no_hub_call(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "Qwen2.5-32B-Instruct"
    sd.stage_model(hub, repo=MODEL, revision=REV_A, dest=dest, workers=2)
    hub.calls.clear()
    assert sd.stage_model(hub, repo=MODEL, revision=REV_A, dest=dest, workers=2) is False
    assert hub.calls == []


def test_new_model_revision_restages(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "Qwen2.5-32B-Instruct"
    sd.stage_model(hub, repo=MODEL, revision=REV_A, dest=dest, workers=2)
    assert sd.stage_model(hub, repo=MODEL, revision=REV_B, dest=dest, workers=2) is True
    assert (dest / "config.json").read_bytes() == b'{"model_type": "qwen2", "v": 2}'
    assert json.loads((dest / ".verl-gke-staged.json").read_text())["revision"] == REV_B


def test_failed_restage_leaves_no_valid_marker(hub: DirHub, data_root: Path) -> None:
    dest = data_root / "Qwen2.5-32B-Instruct"
    sd.stage_model(hub, repo=MODEL, revision=REV_A, dest=dest, workers=2)
    hub.fail = ConnectionError("reset by peer")
    with pytest.raises(sd.StagingError, match=f"^listing model {MODEL}@{REV_B}: ConnectionError: reset by peer$"):
        sd.stage_model(hub, repo=MODEL, revision=REV_B, dest=dest, workers=2)
    assert not (dest / ".verl-gke-staged.json").exists()


def test_failed_shard_download_fails_the_run_naming_the_file(hub: DirHub, data_root: Path) -> None:
    class FlakyHub(DirHub):
        def download(self, repo: str, repo_type: str, revision: str, filename: str, local_dir: Path) -> Path:
            if filename == "model-00002-of-00002.safetensors":
                raise TimeoutError("read timed out")
            return super().download(repo, repo_type, revision, filename, local_dir)

    flaky = FlakyHub()
    flaky.repos = hub.repos
    with pytest.raises(sd.StagingError) as e:
        sd.stage_model(flaky, repo=MODEL, revision=REV_A, dest=data_root / "m", workers=1)
    assert str(e.value) == (
        f"downloading model-00002-of-00002.safetensors from {MODEL}@{REV_A}: TimeoutError: read timed out"
    )
    assert not e.value.permanent
    assert not (data_root / "m" / ".verl-gke-staged.json").exists()


def test_short_download_is_a_failure(hub: DirHub, data_root: Path) -> None:
    class ShortHub(DirHub):
        def download(self, repo: str, repo_type: str, revision: str, filename: str, local_dir: Path) -> Path:
            path = super().download(repo, repo_type, revision, filename, local_dir)
            if filename == "config.json":
                path.write_bytes(b"{}")
            return path

    short = ShortHub()
    short.repos = hub.repos
    with pytest.raises(sd.StagingError, match=r"^model file config.json: 2 bytes on the bucket, the Hub says 23$"):
        sd.stage_model(short, repo=MODEL, revision=REV_A, dest=data_root / "m", workers=1)
    assert not (data_root / "m" / ".verl-gke-staged.json").exists()


# --- the command line and failures --------------------------------------------------------------


def _argv(data_root: Path, **overrides: str) -> list[str]:
    flags = {
        "--model-repo": MODEL,
        "--model-revision": REV_A,
        "--dataset-repo": DATASET,
        "--dataset-config": "main",
        "--dataset-revision": REV_A,
        "--data-root": str(data_root),
        "--workers": "2",
        **{f"--{k.replace('_', '-')}": v for k, v in overrides.items()},
    }
    return [item for pair in flags.items() for item in pair]


def test_main_stages_everything_then_skips(hub: DirHub, data_root: Path) -> None:
    assert sd.main(_argv(data_root), hub=hub) == 0
    assert (data_root / "Qwen2.5-32B-Instruct" / "config.json").exists()
    assert (data_root / "gsm8k" / "train.parquet").exists()
    hub.calls.clear()
    assert sd.main(_argv(data_root), hub=hub) == 0
    assert hub.calls == []


def test_model_dir_flag(hub: DirHub, data_root: Path) -> None:
    assert sd.main(_argv(data_root, model_dir="qwen32b"), hub=hub) == 0
    assert (data_root / "qwen32b" / "config.json").exists()


def test_missing_repo_is_permanent_and_one_line(
    hub: DirHub, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.fail = RepositoryNotFoundError("404 Client Error.\nRepository Not Found for url: https://hub/api/datasets/x")
    assert sd.main(_argv(data_root), hub=hub) == sd.EXIT_PERMANENT
    err = capsys.readouterr().err
    assert err == (
        f"stage-data: failed: listing dataset {DATASET}@{REV_A}: "
        "404 Client Error. Repository Not Found for url: https://hub/api/datasets/x\n"
    )


def test_network_failure_is_transient(hub: DirHub, data_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub.fail = ConnectionError("connection reset")
    assert sd.main(_argv(data_root), hub=hub) == sd.EXIT_TRANSIENT
    assert capsys.readouterr().err == (
        f"stage-data: failed: listing dataset {DATASET}@{REV_A}: ConnectionError: connection reset\n"
    )


def test_token_never_appears_in_the_failure_line(
    hub: DirHub, data_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRET")
    hub.fail = RuntimeError("request with Authorization: Bearer hf_SECRETSECRET failed")
    assert sd.main(_argv(data_root), hub=hub) == sd.EXIT_TRANSIENT
    captured = capsys.readouterr()
    assert "hf_SECRETSECRET" not in captured.err + captured.out
    assert captured.err == (
        f"stage-data: failed: listing dataset {DATASET}@{REV_A}: "
        "RuntimeError: request with Authorization: Bearer [redacted] failed\n"
    )


def test_missing_data_root_is_permanent(hub: DirHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sd.main(_argv(tmp_path / "nope"), hub=hub) == sd.EXIT_PERMANENT
    assert "is not a directory: is the bucket claim mounted?" in capsys.readouterr().err
    assert hub.calls == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_revision": "main"}, "--model-revision 'main' is not a commit SHA (40 lowercase hex digits); pin one"),
        ({"dataset_revision": "A" * 40}, f"--dataset-revision '{'A' * 40}' is not a commit SHA"),
        ({"model_repo": "Qwen2.5-32B"}, "--model-repo 'Qwen2.5-32B' is not a Hub repo id like owner/name"),
        ({"dataset_repo": "hendrycks/competition_math"},
         "--dataset-repo 'hendrycks/competition_math': staging preprocesses only openai/gsm8k (or a copy"),
        ({"model_dir": "../etc"}, "--model-dir '../etc' must be one directory name"),
        ({"model_dir": "gsm8k"}, "--model-dir 'gsm8k' must be one directory name"),
        ({"workers": "0"}, "--workers 0 must be 1..64"),
        ({"workers": "many"}, "bad arguments: argument --workers: invalid int value: 'many'"),
    ],
)
def test_bad_arguments_are_permanent(
    overrides: dict[str, str], message: str, hub: DirHub, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sd.main(_argv(data_root, **overrides), hub=hub) == sd.EXIT_PERMANENT
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert hub.calls == []


def test_hub_error_classification() -> None:
    class GatedRepoError(RepositoryNotFoundError):
        pass

    class HfHubHTTPError(Exception):
        def __init__(self, message: str, status: int) -> None:
            super().__init__(message)
            self.response = type("Response", (), {"status_code": status})()

    gated = sd.hub_error(GatedRepoError("403 gated"), "listing model m@r")
    assert gated.permanent
    assert str(gated).startswith("listing model m@r: gated repository; accept its terms")
    assert sd.hub_error(HfHubHTTPError("401 Unauthorized", 401), "x").permanent
    assert sd.hub_error(HfHubHTTPError("403 Forbidden", 403), "x").permanent
    server = sd.hub_error(HfHubHTTPError("502 Bad Gateway", 502), "downloading a")
    assert not server.permanent
    assert str(server) == "downloading a: HfHubHTTPError: 502 Bad Gateway"
    assert not sd.hub_error(TimeoutError("read timed out"), "x").permanent


def test_progress_line() -> None:
    assert (
        sd.progress_line("model", 12, 37, 24_100_000_000, 65_500_000_000, 100.0)
        == "model: 12/37 files, 24.1 GB/65.5 GB (36%), 241.0 MB/s"
    )
    assert sd.progress_line("model", 0, 0, 0, 0, 0.0) == "model: 0/0 files, 0 B/0 B (100%), -"


def test_script_runs_standalone_and_fails_in_one_line(tmp_path: Path) -> None:
    # As in the Job: run by path, its folder first on the path holding the one project module it loads at
    # start; nothing of this repository's install (-S: no site-packages, -E: no PYTHONPATH).
    script = tmp_path / "stage_data.py"
    shutil.copy(SCRIPT, script)
    (tmp_path / "domain").mkdir()
    shutil.copy(staged.__file__, tmp_path / "domain" / "staged.py")
    result = subprocess.run(
        [sys.executable, "-E", "-S", str(script), "--model-revision", "main", "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "stage-data: failed: --model-revision 'main' is not a commit SHA (40 lowercase hex digits); pin one\n"
    )


# gs:// dataDir (issue 49, item 2): the pinned generations copied into the stack's bucket inside GCS, through the
# one GCS client (workloads/gcs.Gcs.rewrite).
def test_user_data_is_copied_at_its_pinned_generation_once(gcs_emulator: str, tmp_path: Path) -> None:
    from tests.gcs_emulator import make_bucket

    theirs = make_bucket(gcs_emulator, "their-data", tmp_path / "theirs")
    ours = make_bucket(gcs_emulator, "verl-data", tmp_path / "ours")
    first = theirs.write("rl/train.parquet", b"generation one", 0)
    copy = f"gs://their-data/rl/train.parquet#{first}=user-data/0123456789abcdef/train.parquet"
    sd.copy_user_data([copy], ours)
    staged = ours.read("user-data/0123456789abcdef/train.parquet")
    assert staged is not None and staged[0] == b"generation one"
    theirs.write("rl/train.parquet", b"generation two", first)  # GCS without versioning: generation one is gone
    sd.copy_user_data([copy], ours)  # staged: left as it is
    assert ours.read("user-data/0123456789abcdef/train.parquet") == staged


def test_a_user_data_generation_gone_fails_staging_for_good(gcs_emulator: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Through main: the Job's client (Gcs.in_pod) on the emulator STORAGE_EMULATOR_HOST names; exit 2."""
    from tests.gcs_emulator import make_bucket

    make_bucket(gcs_emulator, "their-data", tmp_path / "theirs")
    make_bucket(gcs_emulator, "verl-data", tmp_path / "ours")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    assert sd.main(["--data-root", str(tmp_path), "--bucket", "verl-data", "--user-data",
                    "gs://their-data/rl/test.parquet#17=user-data/0123456789abcdef/test.parquet"]) == 2
    assert capsys.readouterr().err == ("stage-data: failed: gs://their-data/rl/test.parquet has no generation 17 any "
                                       "more: pin its current one in verl-gke:dataDir\n")


@pytest.mark.parametrize(("answer", "permanent", "line"), [
    (403, True, "this Job's identity may not read gs://their-data/rl/train.parquet: grant it "
     "roles/storage.objectViewer on gs://their-data (docs/verl-settings.md, Your data)"),
    (503, False, "GCS answered 503 to copying gs://their-data/rl/train.parquet"),
    (TimeoutError("the copy is not done"), False, "GCS: TimeoutError: the copy is not done"),
])
def test_a_refused_or_failed_copy_is_one_line(gcs_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              answer: int | Exception, permanent: bool, line: str) -> None:
    """GCS's answers the emulator never gives (it has no IAM, no 503, copies in one call): the rewrite call
    raises as Gcs._answer does for them (urllib's HTTPError; the client's own TimeoutError past its deadline)."""
    from tests.gcs_emulator import make_bucket

    ours = make_bucket(gcs_emulator, "verl-data", tmp_path)

    def refused(*args, **kw):
        raise answer if isinstance(answer, Exception) else urllib.error.HTTPError("u", answer, "no", {}, None)
    monkeypatch.setattr(ours, "rewrite", refused)
    with pytest.raises(sd.StagingError) as caught:
        sd.copy_user_data(["gs://their-data/rl/train.parquet#1=user-data/0123456789abcdef/train.parquet"], ours)
    assert (caught.value.permanent, str(caught.value)) == (permanent, line)


def test_another_jobs_copy_landing_first_is_staged(gcs_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """ifGenerationMatch=0 refused (412: the emulator ignores the precondition on rewrite, GCS does not)."""
    from tests.gcs_emulator import make_bucket
    from workloads.gcs import PreconditionFailed

    ours = make_bucket(gcs_emulator, "verl-data", tmp_path)

    def raced(*args, **kw):
        raise PreconditionFailed("gs://verl-data/user-data/0123456789abcdef/train.parquet: changed by another writer")
    monkeypatch.setattr(ours, "rewrite", raced)
    with caplog.at_level(logging.INFO, logger=sd.log.name):
        sd.copy_user_data(["gs://their-data/rl/train.parquet#1=user-data/0123456789abcdef/train.parquet"], ours)
    assert caplog.messages == ["gs://their-data/rl/train.parquet#1 staged as "
                               "gs://verl-data/user-data/0123456789abcdef/train.parquet"]


def test_user_data_arguments_are_checked() -> None:
    with pytest.raises(sd.StagingError) as caught:
        sd.parse_args(["--user-data", "gs://b/o=elsewhere"])
    assert str(caught.value) == ("--user-data 'gs://b/o=elsewhere' is not "
                                 "gs://BUCKET/OBJECT#GENERATION=user-data/<digest>/<file>; --user-data needs --bucket")


# --- MATH (issue 49): verl 0.6.1's examples/data_preprocess/math_dataset.py ----------------------------------

MATH = staged.MATH_REPO
RAW_MATH = [  # (problem, level, solution, type), as MATH-lighteval's data/*.parquet hold them
    ("What is $1+1$?", "Level 1", "We add: $1+1=\\boxed{2}$.", "Prealgebra"),
    ("Simplify $\\frac{4}{6}$.", "Level 2", "Divide by 2: $\\boxed{\\frac{2}{3}}$", "Algebra"),
    ("How many sides?", "Level 1", "A square has \\boxed 4$ sides.", "Geometry"),
]


def _math_bytes(rows: list[tuple[str, str, str, str]], tmp_path: Path) -> bytes:
    path = tmp_path / "raw-math.parquet"
    pq.write_table(pa.table({k: [r[i] for r in rows] for i, k in enumerate(("problem", "level", "solution", "type"))}),
                   path)
    return path.read_bytes()


def _verl_extract() -> object:
    """verl 0.6.1's own extract_solution of math_dataset.py: remove_boxed(last_boxed_only_string(s)), from the
    pinned wheel's verl/utils/reward_score/math_reward.py (which imports nothing)."""
    import importlib.util

    from domain.platforms import PLATFORMS
    from domain.verl_wheel import unpacked

    path = unpacked(PLATFORMS["a4"].verl) / "verl/utils/reward_score/math_reward.py"
    spec = importlib.util.spec_from_file_location("verl_math_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda s: module.remove_boxed(module.last_boxed_only_string(s))


@pytest.mark.parametrize("solution", [
    "so $x=\\boxed{5}$", "\\boxed{1} then \\boxed{\\frac{a}{b}}", "nested \\boxed{\\{1,2\\}} $", "\\boxed 7$ and",
    "\\boxed{} is zero", "a \\boxed{1} and \\boxed 2", "x \\boxed{\\sqrt{2}}.", "no box", "\\fbox{3}", "\\boxed{open",
])
def test_the_math_ground_truth_is_verls_own_extraction(solution: str) -> None:
    verl = _verl_extract()
    try:
        want: object = verl(solution)
    except (AssertionError, TypeError):  # verl's recipe stops on such a row
        with pytest.raises(ValueError):
            sd.boxed_answer(solution)
        return
    assert sd.boxed_answer(solution) == want


def test_math_is_written_as_verls_recipe_writes_it(hub: DirHub, data_root: Path, tmp_path: Path) -> None:
    hub.repos[("dataset", MATH, staged.MATH_REVISION)] = {
        "data/train-00000-of-00001.parquet": _math_bytes(RAW_MATH, tmp_path),
        "data/test-00000-of-00001.parquet": _math_bytes(RAW_MATH[:1], tmp_path),
        "algebra/train-00000-of-00001.parquet": b"not this config"}
    dest = data_root / "math"
    assert sd.stage_dataset(hub, repo=MATH, config="data", revision=staged.MATH_REVISION, dest=dest) is True
    train = pq.read_table(dest / "train.parquet")
    # datasets' map keeps the columns the recipe does not pop (level, type) ahead of the ones it returns.
    assert train.schema.names == ["level", "type", "data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert train.schema.field("extra_info").type == pa.struct([("split", pa.string()), ("index", pa.int64())])
    rows = train.to_pylist()
    assert rows[1] == {
        "level": "Level 2", "type": "Algebra", "data_source": MATH,
        "prompt": [{"role": "user", "content": "Simplify $\\frac{4}{6}$. Let's think step by step and output the "
                    "final answer within \\boxed{}."}],
        "ability": "math", "reward_model": {"style": "rule", "ground_truth": "\\frac{2}{3}"},
        "extra_info": {"split": "train", "index": 1}}
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "\\frac{2}{3}", "4"]
    # What verl reads, and a data_source its default reward scores on both pinned releases.
    from domain import user_data
    from domain.platforms import PLATFORMS

    assert user_data._columns(train.schema, "prompt", "data_source") == []
    assert all(MATH in user_data.known_sources(PLATFORMS[p].verl)[0] for p in ("a4", "a4x"))


def test_a_math_row_without_a_box_names_its_index(hub: DirHub, data_root: Path, tmp_path: Path) -> None:
    hub.repos[("dataset", MATH, REV_A)] = {
        "data/train-00000-of-00001.parquet": _math_bytes([*RAW_MATH, ("q", "Level 1", "no box", "Algebra")], tmp_path),
        "data/test-00000-of-00001.parquet": _math_bytes(RAW_MATH, tmp_path)}
    with pytest.raises(sd.StagingError) as e:
        sd.stage_dataset(hub, repo=MATH, config="data", revision=REV_A, dest=data_root / "math")
    assert str(e.value) == f"{MATH}@{REV_A}:data/train row 3: no \\boxed{{...}} answer in the solution"
    assert e.value.permanent


def test_main_stages_math_under_its_own_folder(hub: DirHub, data_root: Path, tmp_path: Path) -> None:
    hub.repos[("dataset", MATH, REV_A)] = {
        "data/train-00000-of-00001.parquet": _math_bytes(RAW_MATH, tmp_path),
        "data/test-00000-of-00001.parquet": _math_bytes(RAW_MATH, tmp_path)}
    argv = [a for a in _argv(data_root, dataset_repo=MATH) if a not in ("--dataset-config", "main")]
    assert sd.main(argv, hub=hub) == 0
    assert pq.read_table(data_root / "math" / "test.parquet").num_rows == 3
    assert not (data_root / "gsm8k").exists()


def test_math_defaults_to_its_pinned_commit_and_folder() -> None:
    settings = sd.parse_args(["--dataset-repo", MATH])
    assert (settings.dataset_revision, settings.dataset_config) == (staged.MATH_REVISION, "data")
    assert (sd.parse_args([]).dataset_revision, sd.parse_args([]).dataset_config) == (staged.DEFAULT_DATASET_REVISION,
                                                                                     "main")

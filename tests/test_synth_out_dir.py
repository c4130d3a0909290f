"""`synth --out DIR` replaces only what synth itself wrote: it never deletes a user's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import STACKS
from verl_gke import output_dir, synth


@pytest.fixture
def written(synth_stack, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    synth.write(synth_stack("a4x"), out)
    return out


def test_a_foreign_folder_is_refused_and_left_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "keep.txt").write_text("mine")
    for argv in (["a4-standard"], ["a4-standard", "--set", "verl-gke:gpuNodes=two"]):
        assert synth.main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err == (f"synth failed: --out {tmp_path} is not empty and was not written by synth "
                       f"(no {output_dir.MARKER}); give an empty or new folder\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".git", "keep.txt"]
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert synth.main(["a4", "--out", str(target)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_an_empty_folder_is_used(tmp_path: Path, synth_stack) -> None:
    synth.write(synth_stack("a4"), tmp_path)
    assert (tmp_path / "resources.json").is_file()


def test_the_marker_lists_every_file_written(written: Path) -> None:
    listed = json.loads((written / output_dir.MARKER).read_text())["files"]
    on_disk = sorted(str(p.relative_to(written)) for p in written.rglob("*") if p.is_file())
    assert sorted([*listed, output_dir.MARKER]) == on_disk
    assert "resources.json" in listed and "outputs.json" in listed


def test_a_rerun_replaces_its_own_files_and_keeps_the_users(written: Path, synth_stack) -> None:
    (written / "my-notes.md").write_text("mine")
    (written / "manifests" / "my-extra.yaml").write_text("kind: Mine\n")
    before = set(json.loads((written / output_dir.MARKER).read_text())["files"])
    synth.write(synth_stack("a4-standard"), written)
    after = set(json.loads((written / output_dir.MARKER).read_text())["files"])
    assert before - after  # a4x-only manifests (the DRA objects) ...
    assert not any((written / name).exists() for name in before - after)  # ... are gone
    assert (written / "my-notes.md").read_text() == "mine"
    assert (written / "manifests" / "my-extra.yaml").exists()


def test_a_failed_run_removes_only_its_stale_output(written: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (written / "my-notes.md").write_text("mine")
    assert synth.main(["a4x", "--out", str(written), "--set", "verl-gke:gpuNodes=two"]) == 2
    assert "verl-gke:gpuNodes" in capsys.readouterr().err
    assert sorted(p.name for p in written.iterdir()) == ["my-notes.md"]


def test_a_failed_run_removes_a_folder_left_empty(written: Path) -> None:
    assert synth.main(["a4x", "--out", str(written), "--set", "verl-gke:gpuNodes=two"]) == 2
    assert not written.exists()


def test_a_failed_run_leaves_a_foreign_folder_alone(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert synth.main(["a4x", "--out", str(tmp_path), "--set", "verl-gke:gpuNodes=two"]) == 2
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_a_marker_listing_paths_outside_the_folder_is_refused(tmp_path: Path, synth_stack) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / output_dir.MARKER).write_text(json.dumps({"files": ["../victim.txt"]}))
    with pytest.raises(output_dir.OutputDirError, match="lists a path outside it: '../victim.txt'"):
        synth.write(synth_stack("a4"), out)
    assert victim.read_text() == "mine"


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_writes_to_a_new_folder(stack: str, synth_stack, tmp_path: Path) -> None:
    synth.write(synth_stack(stack), tmp_path / stack)
    assert (tmp_path / stack / output_dir.MARKER).is_file()



@pytest.mark.parametrize("listed", ["keep.txt", {"keep.txt": 1}, [1, "keep.txt"], None])
def test_a_malformed_marker_deletes_nothing(tmp_path: Path, listed, capsys: pytest.CaptureFixture[str]) -> None:
    """A string `files` would be read letter by letter: "k", "e", ... files synth never wrote."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("keep.txt", "k", "e", "p", ".", "t", "x"):
        if name != ".":
            (out / name).write_text("mine")
    (out / output_dir.MARKER).write_text(json.dumps({"files": listed}))
    before = sorted(p.name for p in out.iterdir())
    assert synth.main(["a4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"synth failed: --out {out}: {output_dir.MARKER} is not synth's file list "
                   "(`files` must be a list of file names)\n")
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_marker_listing_a_folder_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    (out / "manifests").mkdir(parents=True)
    (out / "manifests" / "mine.yaml").write_text("mine")
    (out / output_dir.MARKER).write_text(json.dumps({"files": ["manifests"]}))
    assert synth.main(["a4", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"synth failed: --out {out}: {output_dir.MARKER} lists 'manifests', which is "
                                       "a folder, not a file synth wrote; remove that line or the marker\n")
    assert (out / "manifests" / "mine.yaml").read_text() == "mine"


def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       synth_stack, monkeypatch: pytest.MonkeyPatch) -> None:
    # The write is what fails: the stack's shared result stands for main's own synth of it (the same, synth is
    # deterministic: tests/test_synth_deterministic.py).
    result = synth_stack("a4")
    monkeypatch.setattr(synth, "run", lambda stack, **_: result)
    (tmp_path / "file.txt").write_text("mine")
    out = tmp_path / "file.txt" / "sub"
    assert synth.main(["a4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"synth failed: --out {out}: cannot write there (")
    assert "Traceback" not in err


@pytest.mark.parametrize("stack", ["a4\x00", "../a4", ""])
def test_a_stack_name_pulumi_would_refuse_is_one_line(stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth.main([stack]) == 2
    assert capsys.readouterr().err == (f"synth failed: stack {stack!r}: a Pulumi stack name is letters, digits, '-', "
                                       "'_' or '.'; stacks here: a3u-standard, a4, a4-standard, a4x, smoke\n")

"""A folder that synth owns: it replaces only the files it wrote there itself.

Synth lists what it writes in a marker file inside the folder. A folder without the marker that
holds anything is not synth's and is refused, so `--out .` or `--out ~` deletes nothing; files a
user adds to synth's folder survive reruns and failed runs.
"""

from __future__ import annotations

import json
from pathlib import Path

MARKER = ".verl-gke-synth.json"


class OutputDirError(Exception):
    """The folder is not synth's to write: the message names it and what to do."""


def _own_files(out_dir: Path) -> list[Path]:
    """The files an earlier synth run wrote into `out_dir` (none if it is new or empty)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputDirError(f"--out {out_dir} is not a folder")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return []
    marker = out_dir / MARKER
    if not marker.is_file():
        raise OutputDirError(f"--out {out_dir} is not empty and was not written by synth (no {MARKER}); "
                             "give an empty or new folder")
    try:
        listed = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise OutputDirError(f"--out {out_dir}: {MARKER} is not synth's file list ({error})") from None
    # A string would be read letter by letter: files synth never wrote.
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        raise OutputDirError(f"--out {out_dir}: {MARKER} is not synth's file list "
                             "(`files` must be a list of file names)")
    root = out_dir.resolve()
    files = []
    for name in listed:
        path = (out_dir / name).resolve()
        if not path.is_relative_to(root) or path == root:
            raise OutputDirError(f"--out {out_dir}: {MARKER} lists a path outside it: {name!r}")
        if path.is_dir():  # synth writes files only: a folder there is the user's
            raise OutputDirError(f"--out {out_dir}: {MARKER} lists {name!r}, which is a folder, not a file synth "
                                 "wrote; remove that line or the marker")
        files.append(path)
    return [*files, marker]


def _remove(files: list[Path], out_dir: Path) -> None:
    """Unlink `files`, then every folder under `out_dir` (and itself) that this left empty."""
    for path in files:
        path.unlink(missing_ok=True)
    parents = sorted({p.parent for p in files} | {out_dir.resolve()}, key=lambda p: len(p.parts), reverse=True)
    for folder in parents:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def replace(out_dir: Path, files: dict[str, str]) -> None:
    """Write `files` (path relative to `out_dir` -> text) in place of the previous run's output."""
    _remove(_own_files(out_dir), out_dir)
    for name, text in files.items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (out_dir / MARKER).write_text(json.dumps({"writtenBy": "verl-gke synth", "files": list(files)}, indent=2) + "\n")


def check(out_dir: Path) -> None:
    """Raise OutputDirError unless synth may write to `out_dir`."""
    _own_files(out_dir)


def clear(out_dir: Path) -> None:
    """Remove the previous run's output (after a failed run); anything else stays."""
    _remove(_own_files(out_dir), out_dir)

"""The repository stands alone: no comment, message or doc sends readers to files outside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTSIDE = ("FIELD-NOTES", "CONTRACT.md", "STYLE.md", "../shared", "shared/seeds", "/work/shared")
"""Names of the team's own notes beside the repository, which users do not have."""

CI_ENTRY = ".ci/run"
"""Points VERL_GKE_CRD_DIR at the CI machine's local copy of the pinned CRDs: a path, not a reference."""


def test_no_tracked_file_refers_to_files_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True)
    offenders = []
    for name in tracked.stdout.splitlines():
        path = REPO / name
        if name in (CI_ENTRY, "tests/test_self_contained.py") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        offenders += [f"{name}: {word}" for word in OUTSIDE if word in text]
    assert offenders == []

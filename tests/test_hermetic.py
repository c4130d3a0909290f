"""The suite is hermetic: what the user's home holds (Ray's token file, kube and gcloud config, an HF
token, pip's config) changes no result, and the tests write nothing into it (tests/conftest.py gives
the session a HOME of its own; the Ray processes the tests start inherit it)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What a user who uses each tool has in their home; the Ray token is what `ray get-auth-token
# --generate` writes (Ray's authentication_token_setup.py: ~/.ray/auth_token, read when RAY_AUTH_MODE
# is unset, and then `ray start --head` turns token authentication on).
USER_FILES = {
    ".ray/auth_token": "0123456789abcdef0123456789abcdef",
    ".kube/config": "apiVersion: v1\nkind: Config\ncurrent-context: prod\n",
    ".config/gcloud/configurations/config_default": "[core]\nproject = someone-elses-project\n",
    ".cache/huggingface/token": "hf_not_a_real_token",
    ".config/pip/pip.conf": "[global]\nindex-url = http://127.0.0.1:9/simple\n",
}


@pytest.mark.ray
def test_a_head_of_the_tests_answers_without_a_token(ray_head: str) -> None:
    with urllib.request.urlopen(f"{ray_head}/api/version", timeout=10) as response:
        assert response.status == 200


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_the_users_home_changes_no_result_and_is_not_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for name, text in USER_FILES.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(home)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider",
         f"{Path(__file__).relative_to(REPO)}::test_a_head_of_the_tests_answers_without_a_token"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=380)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    assert {name: (home / name).read_text() for name in USER_FILES} == USER_FILES

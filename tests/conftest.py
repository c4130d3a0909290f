"""Shared fixtures: the offline mock engine and whole-stack synth results."""

from __future__ import annotations

from typing import Callable

import pytest

from verl_gke import synth

pytest_plugins = ["tests.ray_head"]

STACKS = ("a4", "a4-standard", "a3u-standard", "a4x")

# A valid raw config as the engine would pass it; tests change one key at a time.
BASE_CONFIG = {
    "gcp:project": "my-project-123",
    "gcp:region": "us-central1",
    "gcp:zone": "us-central1-b",
    "verl-gke:reservation": "my-reservation",
}


@pytest.fixture(scope="session")
def synth_stack() -> Callable[[str], synth.SynthResult]:
    """Runs the real program for a stack under mocks once per session and caches the result."""
    cache: dict[str, synth.SynthResult] = {}

    def get(stack: str) -> synth.SynthResult:
        if stack not in cache:
            cache[stack] = synth.run(stack)
        return cache[stack]

    return get

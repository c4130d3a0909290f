"""The in-memory bucket (tests/gcs_memory.py) answers the calls the markers and the export make as GCS does:
one script of exactly those calls (workloads/gcs.Gcs: write with ifGenerationMatch, put, stat, read of a
named generation, media, list by prefix, age), run against fake-gcs-server (tests/gcs_emulator.py) and
against the stand-in, and the answers compared (generations as their order of appearance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.gcs_emulator import make_bucket
from tests.gcs_memory import Bucket, memory_gcs
from workloads.gcs import Gcs, PreconditionFailed


def script(gcs: Gcs) -> list[Any]:
    seen: list[Any] = []
    labels: dict[int, str] = {}

    def gen(value: int) -> str:
        return labels.setdefault(value, f"g{len(labels)}")

    def call(what: str, fn: Any) -> None:
        try:
            answer = fn()
        except PreconditionFailed:
            answer = "412"
        if isinstance(answer, int) and not isinstance(answer, bool):
            answer = gen(answer)
        seen.append((what, answer))

    call("stat absent", lambda: gcs.stat("m/x.json"))
    call("read absent", lambda: gcs.read("m/x.json"))
    call("claim absent", lambda: gcs.write_json("m/x.json", {"a": 1}, 0))
    first = gcs.stat("m/x.json")
    assert first is not None
    call("claim again", lambda: gcs.write_json("m/x.json", {"a": 2}, 0))
    call("a stale generation", lambda: gcs.write_json("m/x.json", {"a": 2}, first.generation + 1))
    call("an absent object at a generation", lambda: gcs.write_json("m/y.json", {"a": 2}, first.generation))
    call("at its generation", lambda: gcs.write_json("m/x.json", {"a": 3}, first.generation))
    second = gcs.stat("m/x.json")
    assert second is not None
    call("newer", lambda: second.generation > first.generation)
    call("read the live one", lambda: gcs.read_json("m/x.json", second.generation) and
         (gcs.read_json("m/x.json", second.generation)[0], gen(second.generation)))  # type: ignore[index]
    call("read the earlier one", lambda: gcs.read("m/x.json", first.generation))
    call("the earlier one again", lambda: gcs.write_json("m/x.json", {"a": 4}, first.generation))
    call("put", lambda: gcs.put("m/z.bin", b"abc", "application/octet-stream"))
    call("media", lambda: gcs.media("m/z.bin"))
    call("stat", lambda: (lambda s: s and (gen(s.generation), s.size))(gcs.stat("m/z.bin")))
    call("put again", lambda: (gcs.put("m/z.bin", b"abcd", "application/octet-stream"),
                               gen(gcs.stat("m/z.bin").generation)))  # type: ignore[union-attr]
    for n in range(3):
        gcs.put(f"m/d/{n}.bin", bytes(n), "application/octet-stream")
    call("list", lambda: {name: (gen(s.generation), s.size) for name, s in gcs.generations("m/").items()})
    call("list a prefix", lambda: sorted(gcs.generations("m/d/")))
    call("list nothing", lambda: gcs.generations("none/"))
    call("age", lambda: (lambda age: age is not None and 0 <= age < 60)(gcs.age_s("m/x.json")))
    call("age absent", lambda: gcs.age_s("m/none"))
    return seen


def test_the_stand_in_answers_as_fake_gcs_server(gcs_emulator: str, tmp_path: Path) -> None:
    real = script(make_bucket(gcs_emulator, "conformance", tmp_path / "a"))
    stand_in = script(memory_gcs(Bucket("conformance"), tmp_path / "b"))
    assert stand_in == real
    assert ("claim again", "412") in real and ("read the earlier one", None) in real


def test_a_write_through_the_mount_is_a_new_generation(tmp_path: Path) -> None:
    """GCS FUSE uploads a file on close: each rewrite of it, even of the same bytes, a new generation."""
    store = Bucket("b", mount=tmp_path)
    gcs = memory_gcs(store, tmp_path)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "f").write_bytes(b"1")
    one = gcs.stat("s/f")
    (tmp_path / "s" / "f").write_bytes(b"2")
    two = gcs.stat("s/f")
    assert one is not None and two is not None and two.generation > one.generation
    (tmp_path / "s" / "f").unlink()
    assert gcs.stat("s/f") is None

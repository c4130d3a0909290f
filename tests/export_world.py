"""A world for the export's protocol, driven one action at a time (tests/test_run_interleavings.py): the real
exports (workloads/export_model.export: the supervisor's final export and `verl-gke export`, each in a thread
that runs only when the schedule lets it, from one pause point to the next: a request to the bucket, a
shard the merger reads), the real copiers saving a step again (workloads/checkpoints.py: announce_step, then
each rank's publish_part, which writes the marker) and crashes between any two of those. The bucket is
tests/gcs_memory.Bucket over a folder standing for the mount; the merger a stand-in that concatenates the
shards it reads, rank by rank, on the world's clock."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path

from tests.gcs_memory import Bucket, MemoryGcs, memory_gcs
from workloads import checkpoints, export_model

RUN = "run-1"
WORLD_SIZE = 2
MODEL = "model.safetensors"
STEP_TIMEOUT_S = 30.0
"""How long the schedule waits for a process to reach its next pause (each runs only local, quick code)."""


class Killed(BaseException):
    """The process died here (a pod deleted, a node lost): nothing after this point runs."""


class Process:
    """One export in a thread of its own, parked at each pause point until `step` lets it on."""

    _here = threading.local()

    def __init__(self, name: str, fn: Callable[[], object]) -> None:
        self.name = name
        self.result: object = None
        self.error: BaseException | None = None
        self.done = self.killed = False
        self._go, self._parked = threading.Semaphore(0), threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name=name)
        self._thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        Process._here.current = self
        try:
            self._go.acquire()
            if self.killed:
                raise Killed
            self.result = fn()
        except BaseException as error:  # noqa: BLE001 - the schedule reads it
            self.error = error
        finally:
            self.done = True
            self._parked.release()

    @classmethod
    def pause(cls) -> None:
        """In a process's own thread: park until the schedule lets it on (a dead one goes no further)."""
        me: Process | None = getattr(cls._here, "current", None)
        if me is None:
            return  # the schedule's own thread (the copiers, the checks)
        if me.killed:
            raise Killed
        me._parked.release()
        me._go.acquire()
        if me.killed:
            raise Killed

    def step(self) -> None:
        assert not self.done
        self._go.release()
        assert self._parked.acquire(timeout=STEP_TIMEOUT_S), f"{self.name} did not reach a pause in {STEP_TIMEOUT_S} s"
        if self.done:
            self._thread.join(timeout=STEP_TIMEOUT_S)

    def kill(self) -> None:
        self.killed = True
        self.step()


class ExportWorld:
    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="verl-gke-export-world-")
        root = Path(self._tmp.name)
        self.mount, self.local = root / "data", root / "local"
        self.mount.mkdir()
        self.now = 0.0
        self.bucket = Bucket("verl-data", clock=lambda: self.now, mount=self.mount)
        self.gcs: MemoryGcs = memory_gcs(self.bucket, self.mount, before=Process.pause)
        self.run_dir = self.mount / "verl" / "checkpoints" / RUN
        self.target = self.mount / export_model.model_path(RUN)
        self.processes: dict[str, Process] = {}
        self.finished: list[Process] = []
        self.actions = 0
        self.attempts = 0
        self.saving: dict | None = None
        """The save in progress: step, attempt, the ranks still to copy."""
        self.log: list[str] = []
        self._restore: list[Callable[[], None]] = []
        self._patch(checkpoints, "GENERATIONS", self._generations)
        self._patch(export_model, "subprocess", types.SimpleNamespace(run=self._merge,
                                                                       TimeoutExpired=subprocess.TimeoutExpired))

    def _patch(self, module: object, name: str, value: object) -> None:
        old = getattr(module, name)
        setattr(module, name, value)
        self._restore.append(lambda: setattr(module, name, old))

    def close(self) -> None:
        for process in self.processes.values():
            if not process.done:
                process.kill()
        for restore in reversed(self._restore):
            restore()
        self._tmp.cleanup()

    def _generations(self, step_dir: Path) -> dict[str, int]:
        """checkpoints.use_bucket's GENERATIONS, through the stand-in."""
        prefix = self.gcs.name(step_dir) + "/"
        return {name[len(prefix):]: stat.generation for name, stat in self.gcs.generations(prefix).items()}

    def _merge(self, command: list[str], *, timeout: float, **_kw: object) -> subprocess.CompletedProcess:
        """verl's merger: each rank's model shard read in turn (a pause before each), the model their
        concatenation; past `timeout` s of the world's clock it is killed (subprocess.run's TimeoutExpired)."""
        actor = Path(command[command.index("--local_dir") + 1])
        target = Path(command[command.index("--target_dir") + 1])
        began = self.now
        data = b""
        for rank in range(WORLD_SIZE):
            Process.pause()
            if self.now - began > timeout:
                raise subprocess.TimeoutExpired(command, timeout)
            data += (actor / f"model_world_size_{WORLD_SIZE}_rank_{rank}.pt").read_bytes()
        target.mkdir(parents=True)
        (target / MODEL).write_bytes(data)
        return subprocess.CompletedProcess(command, 0, "", "")

    # --- the copiers ------------------------------------------------------------------------------------

    def save_begins(self, step: int) -> None:
        """An attempt's verl saved `step` on every node (locally); its trainer announces it."""
        self.attempts += 1
        attempt = f"a{self.attempts}"
        for rank in range(WORLD_SIZE):
            actor = self.local / attempt / str(rank) / f"global_step_{step}" / "actor"
            actor.mkdir(parents=True)
            (actor / f"model_world_size_{WORLD_SIZE}_rank_{rank}.pt").write_bytes(f"{attempt}/{rank};".encode())
            if rank == 0:
                (actor / "fsdp_config.json").write_text(json.dumps({"world_size": WORLD_SIZE}))
                (actor / "huggingface").mkdir()
                (actor / "huggingface" / "config.json").write_text("{}")
        checkpoints.announce_step(self.run_dir, step, attempt, WORLD_SIZE, self.log.append)
        self.saving = {"step": step, "attempt": attempt, "ranks": list(range(WORLD_SIZE))}

    def rank_copies(self, rank: int) -> None:
        assert self.saving is not None
        step, attempt = self.saving["step"], self.saving["attempt"]
        local = self.local / attempt / str(rank) / f"global_step_{step}"
        try:
            checkpoints.publish_part(self.run_dir, local, step, attempt, f"rank-{rank}", self.log.append)
        except checkpoints.Superseded:
            pass
        self.saving["ranks"].remove(rank)
        if not self.saving["ranks"]:
            self.saving = None

    # --- the exports ------------------------------------------------------------------------------------

    def export_starts(self, who: str) -> Process:
        self.actions += 1
        export_id = f"{export_model.SUBMISSION_PREFIX}{RUN}-final-{who}{self.actions}"

        def body() -> object:
            return export_model.export(self.run_dir, self.target, python="python", timeout_s=export_model.MERGE_TIMEOUT_S,
                                       memory_bytes=10**9, gcs=self.gcs, export_id=export_id)
        process = Process(export_id, body)
        self.processes[who] = process
        process.step()
        return process

    def published(self) -> dict | None:
        """models/<run>/model.json: what the last export that published says it published."""
        got = self.bucket.objects.get(self.gcs.name(self.target) + export_model.POINTER_SUFFIX)
        return None if got is None else json.loads(got[1])

    def claim(self) -> dict | None:
        got = self.bucket.objects.get(f"{self.gcs.name(self.target.parent)}/{export_model.CLAIM}")
        return None if got is None else json.loads(got[1])

    def claim_span(self, export_id: str) -> tuple[int, int]:
        """The generations of the run's claim from `export_id`'s first write of it to its last (GCS numbers
        every write in order: two spans that overlap were held at once)."""
        name = f"{self.gcs.name(self.target.parent)}/{export_model.CLAIM}"
        mine = [gen for (obj, gen), data in self.bucket.history.items()
                if obj == name and json.loads(data).get("export") == export_id]
        return min(mine), max(mine)

    def model_of(self, sources: dict[str, int]) -> bytes:
        """The model the merger makes of the shards at `sources`' generations."""
        shards = sorted(name for name in sources if "/actor/model_world_size_" in name)
        return b"".join(self.bucket.history[(name, sources[name])] for name in shards)

    def vouched(self, step: int) -> list[dict[str, int]]:
        """Every generation set a model marker of `step` ever named (object name -> generation)."""
        prefix = f"{self.gcs.name(self.run_dir)}/global_step_{step}/"
        marker = prefix + checkpoints.MODEL_MARKER
        return [{prefix + name: gen for name, gen in json.loads(data).get("generations", {}).items()}
                for (name, _), data in self.bucket.history.items() if name == marker]

"""The GPU fabric check: an all-reduce across every GPU of the Ray cluster, run as a Ray job before
the GRPO run. A cluster whose RDMA or NVLink path is broken still trains, over TCP, many times
slower; its bus bandwidth gives it away in seconds.

One Ray actor per GPU (a STRICT_SPREAD placement group) times `--iters` all-reduces of `--size-mb` and
prints `FABRIC_RESULT {json}` with nccl-tests' bus bandwidth; `--backend gloo` runs it on CPUs.
Runs with the image's Python, Ray and torch; imports nothing of verl-gke.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import socket
import sys
import time
from collections import Counter

RESULT_PREFIX = "FABRIC_RESULT "
# NCCL's connection lines, one per channel and peer (NCCL_DEBUG=INFO; the INIT subsystem is on by
# default). Their format: src/transport/net.cc sendSetup/recvSetup,
#   "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s" (net name, device, /GDRDMA, ...),
# and src/transport/p2p.cc p2pSendSetup, "... via P2P/%s%s%s" (MNNVL or CUMEM, /read, /CE), or
# "via P2P/IPC", "via P2P/direct pointer"; src/transport/shm.cc "via SHM/direct/direct". Each line
# starts with src/debug.cc's "<host>:<pid>:<tid> [<dev>] NCCL INFO ", and Ray adds its worker prefix.
_NCCL_VIA = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : \d+\[\w+\] -> \d+\[\w+\]"
                       r"(?: \[(?:send|receive)\])? via (NET/[^/\s]+|P2P/\w+|SHM|[A-Za-z]+)")
PLACEMENT_TIMEOUT_S = 300
"""How long the GPUs may take to be free for the check (a run that just stopped releases them)."""


def bus_bandwidth_gbps(size_bytes: int, seconds: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s (10^9 bytes), comparable across world sizes."""
    factor = 2 * (world - 1) / world if world > 1 else 1.0
    return size_bytes / seconds * factor / 1e9


def nccl_transports(log: str) -> Counter[str]:
    """How many NCCL connections each transport carries in `log` (`NET/IB`, `NET/gIB`, `NET/Socket`,
    `P2P/MNNVL`, `P2P/IPC`, `SHM`, ...), from NCCL's INFO connection lines."""
    return Counter(match.group(1) for match in _NCCL_VIA.finditer(log))


def _rank_actor():  # the class is built after `import ray`, which only the job's driver has
    import ray

    @ray.remote
    class Rank:
        def node_ip_and_port(self) -> tuple[str, int]:
            with socket.socket() as sock:
                sock.bind(("", 0))
                port = sock.getsockname()[1]
            return ray.util.get_node_ip_address(), port

        def run(self, *, rank: int, world: int, backend: str, master: str, size_bytes: int,
                iters: int, warmup: int) -> float:
            import torch
            import torch.distributed as dist

            dist.init_process_group(backend, init_method=f"tcp://{master}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=PLACEMENT_TIMEOUT_S))
            try:
                device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
                tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)

                def sync() -> None:
                    if backend == "nccl":
                        torch.cuda.synchronize()

                for _ in range(warmup):
                    dist.all_reduce(tensor)
                sync()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(tensor)
                sync()
                return (time.perf_counter() - start) / iters
            finally:
                dist.destroy_process_group()

    return Rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)

    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(logging_level="WARNING")
    group = placement_group([{"GPU": args.gpus_per_node}] * args.nodes, strategy="STRICT_SPREAD")
    if not group.wait(PLACEMENT_TIMEOUT_S):
        print(f"fabric check: {args.nodes} nodes x {args.gpus_per_node} free GPUs not found within "
              f"{PLACEMENT_TIMEOUT_S} s", file=sys.stderr)
        return 2
    rank_actor = _rank_actor()
    actors = [
        rank_actor.options(num_cpus=0, num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=node)).remote()
        for node in range(args.nodes) for _ in range(args.gpus_per_node)
    ]
    ip, port = ray.get(actors[0].node_ip_and_port.remote())
    world = len(actors)
    size_bytes = args.size_mb * 2**20
    seconds = ray.get([
        actor.run.remote(rank=rank, world=world, backend=args.backend, master=f"{ip}:{port}",
                         size_bytes=size_bytes, iters=args.iters, warmup=args.warmup)
        for rank, actor in enumerate(actors)
    ])
    slowest = max(seconds)
    result = {
        "busbw_gbps": round(bus_bandwidth_gbps(size_bytes, slowest, world), 2),
        "algbw_gbps": round(size_bytes / slowest / 1e9, 2),
        "world": world, "nodes": args.nodes, "backend": args.backend, "size_mb": args.size_mb,
        "iters": args.iters,
    }
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

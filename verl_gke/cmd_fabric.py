"""`verl-gke fabric`: the fabric check the deploy runs (access.fabric), on demand: an all-reduce across
every GPU worker as a Ray job, its bus bandwidth against the platform's floor."""

from __future__ import annotations

import argparse
import time
from typing import Any

from access import fabric
from access.cluster_readiness import ClusterNotReadyError, await_capacity
from verl_gke import reach, stack_outputs
from verl_gke.console import CliError, positive_float, progress


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    fab = subparsers.add_parser(
        "fabric", parents=parents, help="measure the GPU fabric: all-reduce bus bandwidth across the workers",
        description="Run the fabric check the deploy runs before the GRPO run: an all-reduce across every GPU "
                    "worker as a Ray job, its bus bandwidth printed, once every worker and GPU joined (waited for "
                    "up to --head-timeout). Exit 1 below the floor. The GPUs must be free: while the run trains, the "
                    "check waits for them until its timeout.")
    fab.add_argument("--min-busbw", type=float, metavar="GBPS",
                     help="floor in GB/s (default: the platform's; 0 only reports)")
    fab.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                     help="nccl on GPUs (default); gloo runs the same check on CPUs")
    fab.add_argument("--python", default="python3", help="Python on the head that runs the check (default python3)")
    fab.add_argument("--size-mb", type=int, default=256, metavar="MB", help="all-reduce size (default 256)")
    fab.add_argument("--timeout", type=positive_float, default=fabric.TIMEOUT_S, metavar="S",
                     help=f"stop the check after S seconds (default {fabric.TIMEOUT_S:g})")
    fab.set_defaults(handler=cmd_fabric)


def cmd_fabric(args: argparse.Namespace) -> int:
    from domain.platforms import PLATFORMS

    outputs = stack_outputs.load(args.outputs, args.stack)
    platform = PLATFORMS.get(outputs.gpu_platform)
    if platform is None:
        raise CliError(f"{outputs.source}: gpuPlatform {outputs.gpu_platform!r} is not one of {', '.join(PLATFORMS)}")
    floor = platform.fabric_min_busbw_gbps if args.min_busbw is None else args.min_busbw
    check = fabric.FabricCheck(nodes=outputs.gpu_nodes, gpus_per_node=outputs.gpus_per_node, min_busbw_gbps=floor,
                               backend=args.backend, python=args.python, size_mb=args.size_mb,
                               runtime_env=fabric.fabric_runtime_env(platform), timeout_s=args.timeout,
                               transports=platform.fabric_transports)
    with reach.head(args, outputs) as url:
        try:
            await_capacity(url, workers=check.nodes, gpus=check.nodes * check.gpus_per_node,
                           deadline=time.monotonic() + args.head_timeout, address=url, what="fabric check")
        except ClusterNotReadyError as error:
            raise CliError(str(error)) from None
        client = reach.job_client(url)
        progress(f"all-reduce of {check.size_mb} MB across {check.nodes} nodes x {check.gpus_per_node} GPUs "
                  f"({check.backend})")
        result = reach.ray_call(url, "running the fabric check",
                           lambda: fabric.run_fabric_check(client, check, outputs.gpu_platform))
    print(f"bus bandwidth {result['busbw_gbps']:g} GB/s (algorithm bandwidth {result['algbw_gbps']:g} GB/s) over "
          f"{result['nodes']} nodes x {check.gpus_per_node} GPUs, {result['backend']}, job {result['submission_id']}")
    print(f"NCCL transports: {fabric.transports_text(result['transports']) or 'none logged'}")
    if message := fabric.verdict(result, check):
        raise CliError(message)
    return 0

"""Every image a stack runs, and where its digest comes from; the maintainer's command that pins them
in the repository.

A digest in domain/platforms.py (IMAGE_DIGESTS) is pinned for every stack; an image without one is
pinned at the stack's first `pulumi up` (components/pinned_image.py). On a machine that reaches the
registries, `python -m verl_gke.image_pins` writes every digest into the table (all or nothing; review
and commit); `--stack <stack>` prints `pulumi config set` lines for verl-gke:imageDigests, `--check`
exits 1 if an image or a chart (verl-gke:chartDigests) is unpinned (CI), and `--binauthz-policy`
prints a Binary Authorization policy admitting exactly those digests (manifests/binauthz.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from domain import platforms
from domain.chart_archive import ChartArchiveError, fetch
from domain.config import ConfigError, StackConfig, load_config
from domain.image_mirror import is_docker_hub, mirrored, registry_prefix, repository_id
from domain.stack_files import PROJECT_DIR, raw_config
from domain.platforms import PLATFORMS, repository_pin
from manifests import binauthz, dra, kuberay, nccl, staging
from manifests.helm import HelmChart
from access.registry import RegistryError, resolve_digest

TAGGED_IMAGES: tuple[str, ...] = tuple(sorted(
    {p.image for p in PLATFORMS.values()} | {p.nccl_installer_image for p in PLATFORMS.values() if p.nccl_installer_image}
    | {kuberay.CHART.image, dra.CHART.image}))
"""The images of the platform table and the charts, which come by tag and are pinned by this command."""
TABLE = Path(platforms.__file__)
_BLOCK = re.compile(r"(# BEGIN IMAGE_DIGESTS[^\n]*\n)(.*?)(# END IMAGE_DIGESTS\n)", re.DOTALL)


def block(digests: dict[str, str]) -> str:
    """The table's text between its BEGIN and END lines for `digests`."""
    return "IMAGE_DIGESTS: dict[str, str] = {\n" + "".join(
        f'    "{image}": "{digest}",\n' for image, digest in sorted(digests.items())) + "}\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_gke.image_pins", description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE, help=f"the platform table to write (default {TABLE})")
    parser.add_argument("--stack", help="print the `pulumi config set` commands pinning this stack's images instead")
    parser.add_argument("--check", action="store_true",
                        help="with --stack: ask no registry; exit 1 naming each image with no digest in the "
                             "repository or the stack's config")
    parser.add_argument("--binauthz-policy", action="store_true",
                        help="with --stack: ask no registry; print a Binary Authorization policy admitting exactly "
                             "the stack's images at their pinned digests and GKE's own; exit 1 naming each unpinned "
                             "image")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check and args.binauthz_policy:
        parser.error("--check and --binauthz-policy: one at a time")
    if args.stack:
        return _stack(args.stack, args.project_dir, args.check, args.binauthz_policy)
    if args.check or args.binauthz_policy:
        parser.error("--check and --binauthz-policy need --stack")
    digests = {}
    for image in TAGGED_IMAGES:
        try:
            digests[image] = resolve_digest(image)
        except RegistryError as error:
            print(f"image_pins: {error}", file=sys.stderr)
            print(f"image_pins: nothing written to {args.table}", file=sys.stderr)
            return 1
        print(f"{image} -> {digests[image]}")
    text = args.table.read_text()
    if len(_BLOCK.findall(text)) != 1:
        print(f"image_pins: {args.table} has no one IMAGE_DIGESTS block between its BEGIN and END lines",
              file=sys.stderr)
        return 1
    part = args.table.with_name(args.table.name + ".part")
    part.write_text(_BLOCK.sub(lambda m: m.group(1) + block(digests) + m.group(3), text))
    os.replace(part, args.table)
    print(f"wrote {len(digests)} digests to {args.table}")
    return 0


def _stack(stack: str, project_dir: Path, check: bool, binauthz_policy: bool = False) -> int:
    try:
        raw, _ = raw_config(stack, project_dir)
        cfg = load_config(raw, f"Pulumi.{stack}.yaml")
    except (ConfigError, FileNotFoundError) as error:
        print(f"image_pins: {error}", file=sys.stderr)
        return 1
    if binauthz_policy:
        return _binauthz_policy(stack, cfg)
    images, by_tag = stack_images(cfg)
    unpinned = sorted({i.image for i in images if not repository_pin(i.image, cfg.image_digests)})
    charts = [chart for chart in stack_charts(cfg) if chart.key not in cfg.chart_digests]
    if check:
        for image in unpinned:
            print(f"image_pins: stack {stack} would pull {image} by a digest asked at `pulumi up`: pin it first "
                  f"(`python -m verl_gke.image_pins --stack {stack}` prints the command)", file=sys.stderr)
        for chart in charts:
            print(f"image_pins: stack {stack} would install chart {chart.key} with no sha256 in verl-gke:chartDigests "
                  f"(its archive's digest is asked at `pulumi up`): pin it first (`python -m verl_gke.image_pins "
                  f"--stack {stack}` prints the command)", file=sys.stderr)
        if by_tag:
            print(f"image_pins: stack {stack} applies by tag: {by_tag}", file=sys.stderr)
        return 1 if unpinned or charts else 0
    lines = []
    for image in unpinned:
        try:
            digest = resolve_digest(image)
        except RegistryError as error:
            print(f"image_pins: {error}", file=sys.stderr)
            return 1
        lines.append(shlex.join(["pulumi", "config", "set", "--stack", stack, "--path",
                                 f'verl-gke:imageDigests["{image}"]', digest]))
    for chart in charts:
        try:
            _, digest = fetch(chart.url)
        except ChartArchiveError as error:
            print(f"image_pins: {error}", file=sys.stderr)
            return 1
        lines.append(chart.pin_command(digest, stack))
    print("\n".join(lines) if lines else f"every image and chart of stack {stack} is pinned")
    return 0


def _binauthz_policy(stack: str, cfg: StackConfig) -> int:
    """Print the policy admitting `cfg`'s images at their digests, or why it cannot be written (exit 1)."""
    images, by_tag = stack_images(cfg)
    pins = {i.image: repository_pin(i.image, cfg.image_digests) for i in images}
    problems = [f"image_pins: stack {stack} has no digest for {image}: pin it first (`python -m "
                f"verl_gke.image_pins --stack {stack}` prints the command)"
                for image, pin in sorted(pins.items()) if pin is None]
    if by_tag:
        problems.append(f"image_pins: stack {stack} applies by tag {by_tag}: the policy would refuse its pods")
    if not cfg.project:
        problems.append(f"image_pins: stack {stack} has no gcp:project to name the policy after")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(binauthz.policy_yaml(cfg.project, [_pulled_as(cfg, image, pin) for image, pin in pins.items() if pin]),
          end="")
    return 0


def _pulled_as(cfg: StackConfig, image: str, pin: str) -> str:
    """`pin` as the pod specs name it: the Ray image through the stack's mirror of Docker Hub (__main__.py)."""
    if image == (cfg.verl_image or cfg.facts.image) and cfg.image_mirror and is_docker_hub(image):
        return mirrored(pin, registry_prefix(cfg.region, cfg.project, repository_id(cfg.cluster_name)))
    return pin


@dataclass(frozen=True)
class StackImage:
    image: str
    """As the program names it: `name:tag`, or with its digest where the code pins it."""
    runs: str
    """What runs it."""

    @property
    def shown(self) -> str:
        return f"{self.image.partition('@')[0]} ({self.runs})"


def stack_images(cfg: StackConfig) -> tuple[list[StackImage], str | None]:
    """The images `cfg`'s stack pulls, and what it applies by tag as someone else wrote it (or None)."""
    facts = cfg.facts
    images = [StackImage(cfg.verl_image or facts.image, "Ray head and workers"),
              StackImage(staging.IMAGE, "staging, run supervisor" if cfg.run_supervisor else "staging")]
    by_tag = None
    if cfg.nccl_installer_url:
        by_tag = "your NCCL installer manifest (ncclInstallerUrl), applied as written"
    elif nccl.google_installer_url(facts, cfg.cluster_mode):
        by_tag = ("Google's Autopilot NCCL installer manifest, applied as Google wrote it (Autopilot admits its "
                  "privileged pods only so)")
    elif facts.nccl_installer_image:  # none where NCCL runs over TCP (G2)
        images += [StackImage(facts.nccl_installer_image, "NCCL installer"),
                   StackImage(nccl.PAUSE_IMAGE, "NCCL installer")]
    runs = {kuberay.CHART: "KubeRay operator", dra.CHART: "NVIDIA DRA driver"}
    images += [StackImage(chart.image, runs[chart]) for chart in stack_charts(cfg)]
    return images, by_tag


def stack_charts(cfg: StackConfig) -> list[HelmChart]:
    """The Helm charts `cfg`'s stack installs."""
    return [*([kuberay.CHART] if cfg.ray_operator == "helm" else []), *([dra.CHART] if cfg.platform == "a4x" else [])]


def summary_lines(cfg: StackConfig) -> list[str]:
    """What synth says of the stack's images: pinned in the repository, or at the first `pulumi up`."""
    images, by_tag = stack_images(cfg)
    in_repo = [i for i in images if repository_pin(i.image)]
    in_config = [i for i in images if not repository_pin(i.image) and repository_pin(i.image, cfg.image_digests)]
    at_up = [i for i in images if not repository_pin(i.image, cfg.image_digests)]
    lines = ["Images (every one pulled by digest):" if by_tag is None else
             "Images (every one pulled by digest, but one by tag):"]
    lines.append("  pinned in the repository: " + ", ".join(i.shown for i in in_repo))
    if in_config:
        lines.append("  pinned in the stack's config (imageDigests): " + ", ".join(i.shown for i in in_config))
    if at_up:
        lines.append("  pinned at the first `pulumi up` (no digest in domain/platforms.py or imageDigests; "
                     "`python -m verl_gke.image_pins --stack <stack>` prints them; CI refuses to deploy so):")
        lines += [f"    {i.shown}" for i in at_up]
    if by_tag:
        lines.append(f"  by tag: {by_tag}")
    if charts := stack_charts(cfg):
        # Offline no archive is fetched: where each chart's sha256 will come from.
        lines.append("Charts (installed from their archive, only with its pinned sha256; not fetched by synth):")
        lines += [f"  {c.key}: pinned in the stack's config (chartDigests) to {cfg.chart_digests[c.key]}"
                  if c.key in cfg.chart_digests else
                  f"  {c.key}: pinned at the first `pulumi up` to what {c.url} serves then (kept in the state; "
                  "`python -m verl_gke.image_pins --stack <stack>` prints the config line; CI refuses to deploy so)"
                  for c in charts]
    return lines


if __name__ == "__main__":
    sys.exit(main())

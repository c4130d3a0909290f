"""verl-gke:dataDir's files and verl-gke:rewardFunction's file, uploaded by the program into the bucket
(domain/user_data.py, domain/reward_fn.py): objects named by their content's digest, so the same files are
the same objects and new ones never overwrite what a run reads. Pulumi's state holds the objects' hashes,
not their bytes."""

from __future__ import annotations

from pathlib import Path

import pulumi
from pulumi_gcp import storage as gcs

from components.children import child_options
from domain import reward_fn, user_data


def uploads(data_dir: str, reward_function: str) -> dict[str, Path]:
    """Object name -> local file."""
    out = {}
    if data_dir and not user_data.gs_data(data_dir):  # gs:// data: staging copies it (domain/user_data.py)
        root = Path(data_dir).expanduser()
        out.update({name: root / user_data.FILES[path] for path, name in user_data.object_names(root).items()})
    if reward_function:
        out[reward_fn.object_name(reward_function)] = reward_fn.parse(reward_function)[0]
    return out


class UserData(pulumi.ComponentResource):
    """One bucket object per file; depend on this component to run once they are in the bucket."""

    def __init__(self, name: str, files: dict[str, Path], bucket: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:UserData", name, {}, opts)
        child = child_options(self, opts)
        for object_name, local in files.items():
            gcs.BucketObject(f"{name}-{object_name.split('/', 1)[1].replace('/', '-')}", bucket=bucket,
                             name=object_name, source=pulumi.FileAsset(str(local)), opts=child)
        self.register_outputs({})

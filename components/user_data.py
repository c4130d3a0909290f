"""verl-gke:dataDir's files, uploaded by the program into the bucket (domain/user_data.py): objects named by
the files' digest, so the same files are the same objects and new ones never overwrite what a run reads.
Pulumi's state holds the objects' hashes, not their bytes."""

from __future__ import annotations

from pathlib import Path

import pulumi
from pulumi_gcp import storage as gcs

from components.children import child_options
from domain import user_data


class UserData(pulumi.ComponentResource):
    """One bucket object per file; depend on this component to run once they are in the bucket."""

    def __init__(self, name: str, folder: str, bucket: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("verl-gke:index:UserData", name, {}, opts)
        child = child_options(self, opts)
        root = Path(folder).expanduser()
        for path, object_name in user_data.object_names(root).items():
            gcs.BucketObject(f"{name}-{user_data.FILES[path].removesuffix('.parquet')}", bucket=bucket,
                             name=object_name, source=pulumi.FileAsset(str(root / user_data.FILES[path])),
                             opts=child)
        self.register_outputs({})

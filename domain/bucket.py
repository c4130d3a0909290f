"""The training bucket as every pod sees it."""

DEFAULT_CAPACITY = "768Gi"
MOUNT_PATH = "/data"
"""Where every pod mounts the bucket (the tutorial's paths all start with /data)."""

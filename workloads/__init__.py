"""Programs that run inside the cluster, shipped to their pods as ConfigMap files."""

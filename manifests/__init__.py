"""Pure builders of Kubernetes objects: plain data in, dicts out, no Pulumi."""

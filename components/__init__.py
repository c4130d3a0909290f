"""Pulumi components of verl-gke: one typed ComponentResource per module."""

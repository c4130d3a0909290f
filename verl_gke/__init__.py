"""verl-gke helpers shared by the Pulumi program, the GrpoJob provider and the CLI."""

"""How the program reaches what runs outside it: the Ray head, the cluster's API, image registries.

Imported by both the components (the providers) and verl_gke (the CLI); imports neither."""

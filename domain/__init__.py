"""The domain: the stack config and its rules, the platform table, the run, verl's composition
and the preflight rules. Plain Python, no Pulumi; imports only itself (domain/staged.py, stdlib only, ships to the staging Job)."""

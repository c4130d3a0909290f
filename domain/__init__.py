"""The domain: the stack config and its rules, the platform table, the run, verl's composition
and the preflight rules. Plain Python, no Pulumi; imports only itself. Its bottom, domain/staged.py
(standard library only), also ships to the staging Job."""

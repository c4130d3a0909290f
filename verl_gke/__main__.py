"""`python -m verl_gke`: the same as the `verl-gke` console command."""

import sys

from verl_gke.cli import main

sys.exit(main())

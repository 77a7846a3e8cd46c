"""`python -m fp8mix`: the command-line tools (see fp8mix.cli)."""
from .cli import main

raise SystemExit(main())

"""`python -m envace.cli …` runs the `envace` command (what torchrun and accelerate launch)."""

from envace.cli.main import main

raise SystemExit(main())

"""`python -m triton_mp` runs the CLI."""

from triton_mp.cli.main import main

raise SystemExit(main())

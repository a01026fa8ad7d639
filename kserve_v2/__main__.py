"""`python -m kserve_v2` runs the command line."""

from kserve_v2.cli import main

raise SystemExit(main())

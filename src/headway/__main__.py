"""Allow ``python -m headway``."""

from headway.cli import main

raise SystemExit(main())

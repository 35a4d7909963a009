"""``python -m headway.bench ...``: ``headway bench`` with a faster start."""

from __future__ import annotations

import sys

from headway.bench.commands import main

sys.exit(main())

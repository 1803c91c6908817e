"""`python -m attnkit`: the `attnkit` command line."""

import sys

from attnkit.cli import main

sys.exit(main())

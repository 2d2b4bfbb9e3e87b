"""`python -m tuner` is the same as the `tuner` command."""

import sys

from tuner.cli import main

sys.exit(main())

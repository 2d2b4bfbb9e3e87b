"""`python -m tuner.helper` is the same as the `tuner-helper` command."""

import sys

from tuner.helper.cli import main

sys.exit(main())

"""`python -m tuner.engine ...`: see `tuner.engine.cli`."""

import sys

from tuner.engine.cli import main

if __name__ == "__main__":
    sys.exit(main())

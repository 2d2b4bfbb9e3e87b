"""`python -m tuner.helper` is the same as the `tuner-helper` command."""

import sys

from tuner.helper.cli import main

if __name__ == "__main__":  # importing this module (the import-isolation walk) must not start a helper
    sys.exit(main())

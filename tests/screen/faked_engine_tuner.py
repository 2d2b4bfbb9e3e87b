"""`python -m tuner` with every screen's engine runs faked (test_card_screen.py's `Engines`: each run passes, its
steps compared with the reference): for the examples' scripts, whose tests are about what the scripts do with a
screen's verdict and exit code, not about the engine. The real engine's pass screen through the CLI is
test_screen_cli.py::test_pass_on_another_machine. Run as `python tests/screen/faked_engine_tuner.py ARGS...`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.screen.* below

from tests.screen.test_card_screen import Engines
from tuner.actions.screen import fleet
from tuner.cli import main

_init = fleet.Screen.__init__


def _faked(self, *args, engine_factory=None, **kwargs):
    _init(self, *args, engine_factory=engine_factory or Engines(), **kwargs)


fleet.Screen.__init__ = _faked
sys.exit(main())

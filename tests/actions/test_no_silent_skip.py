"""A command or backend module that is missing is a broken install: it fails loudly, never silently vanishes."""

from __future__ import annotations

import pytest

from tuner import cli
from tuner.backends import open_backend


def test_a_missing_command_module_fails_loudly(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "not_a_command"))
    with pytest.raises(ModuleNotFoundError, match=r"tuner\.commands\.not_a_command"):
        cli.build_parser()


def test_a_missing_backend_module_fails_loudly(monkeypatch):
    monkeypatch.setattr("tuner.backends.REAL_BACKEND_MODULES", ("tuner.backends.not_a_vendor",))
    with pytest.raises(ModuleNotFoundError, match=r"tuner\.backends\.not_a_vendor"):
        open_backend(simulate=False)

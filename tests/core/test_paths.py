"""XDG base directories: the cache directory honours XDG_CACHE_HOME (absolute only, as the spec says)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.core.paths import cache_dir


def test_cache_dir_honours_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "tuner"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid per the spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == Path(tmp_path / "home" / ".cache" / "tuner")


def test_a_relative_home_is_not_used(monkeypatch, tmp_path):
    """With no XDG variable set, the state defaults to ~/.local/state. A relative (or empty) HOME made that
    directory relative to wherever the command ran: `cd /a && tuner bisect` and `cd /b && tuner set` then read
    two different unsafe lists and trial journals. Such a HOME is invalid as a relative XDG value is; the account's
    home (the password database's, as with no HOME at all) is used instead."""
    import pwd

    from tuner.core.paths import config_dir, state_dir

    account_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    for home in ("relative/home", ""):
        monkeypatch.setenv("HOME", home)
        assert state_dir() == account_home / ".local/state/tuner", home
        assert config_dir() == account_home / ".config/tuner", home
    monkeypatch.setenv("HOME", str(tmp_path))  # an absolute HOME is the home
    assert state_dir() == tmp_path / ".local/state/tuner"

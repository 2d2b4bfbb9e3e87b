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


def test_an_empty_override_is_the_default(monkeypatch):
    """`TUNER_SYSFS_ROOT=` (exported empty, or `TUNER_SYSFS_ROOT=$ROOT` with ROOT unset) is no override, as an empty
    TUNER_STATE_DIR or TUNER_HELPER_SOCKET is. Path("") is the current directory: `tuner list` looked for
    ./sys/class/drm and said "no supported GPU found" on a machine with GPUs, and the boot id was read from
    ./proc; an empty TUNER_SYSTEM_PROFILES made the boot profiles those of the current directory."""
    from tuner.core.paths import sysfs_root, system_profiles_dir
    from tuner.core.torch_build import gpu_vendors, needed_build

    monkeypatch.setenv("TUNER_SYSFS_ROOT", "")
    monkeypatch.setenv("TUNER_SYSTEM_PROFILES", "")
    assert sysfs_root() == Path("/")
    assert system_profiles_dir() == Path("/etc/tuner/profiles")
    seen: list[Path] = []
    monkeypatch.setattr("tuner.core.torch_build.gpu_vendors", lambda root: seen.append(root) or gpu_vendors(root))
    needed_build(env={"TUNER_SYSFS_ROOT": ""})
    assert seen == [Path("/")]

"""XDG base directories: the cache directory honours XDG_CACHE_HOME (absolute only, as the spec says)."""

from __future__ import annotations

from pathlib import Path

from tuner.core.paths import cache_dir


def test_cache_dir_honours_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "tuner"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid per the spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == Path(tmp_path / "home" / ".cache" / "tuner")

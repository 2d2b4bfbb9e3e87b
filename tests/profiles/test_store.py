"""The profile store: names, no silent overwrite, no symlinks followed, atomic writes that survive SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.profiles.helpers import REPO, sim_profile
from tuner.core import paths
from tuner.core.errors import PermissionDenied, UsageError
from tuner.profiles import (
    ProfileError,
    delete_profile,
    list_profiles,
    load_profile,
    save_profile,
    validate_name,
)
from tuner.profiles.store import read_profile_file, scan


@pytest.mark.parametrize("name", ["r9700", "rx-9070.xt_2", "A", "x" * 64])
def test_good_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "a/b", "..", "a..b", ".hidden", "-flag", "x" * 65, "a b", "é",
                                  "a\\b", "a\x00b", "~root"])
def test_bad_names(name):
    with pytest.raises(ProfileError, match="bad profile name"):
        validate_name(name)


def test_save_refuses_to_overwrite_without_the_flag():
    first = sim_profile("same", value=-45)
    path = save_profile(first)
    before = path.read_bytes()
    with pytest.raises(UsageError, match="already exists; nothing was written"):
        save_profile(sim_profile("same", value=-50))
    assert path.read_bytes() == before
    save_profile(sim_profile("same", value=-50), overwrite=True)
    assert load_profile("same").setting.value == -50


def test_system_store_and_lookup_order():
    save_profile(sim_profile("both", value=-10), system=True)
    assert load_profile("both").setting.value == -10  # only in the system store
    save_profile(sim_profile("both", value=-20))
    assert load_profile("both").setting.value == -20  # the user store wins
    assert [p.setting.value for p in list_profiles()] == [-20, -10]
    assert (paths.system_profiles_dir() / "both.toml").exists()


def test_a_profile_named_like_a_file_is_applied_by_the_name_it_is_shown_by(tmp_path, monkeypatch, capsys):
    """Imported as `abc.toml` (issue 28, item 10): `profile show abc.toml` found it, `apply abc.toml` looked for a
    file of that name in the current directory. One rule now: the store first, then a file."""
    from tests.profiles.helpers import tuner

    source = tmp_path / "exported.toml"
    source.write_text(sim_profile("plain", value=-25).to_toml())
    assert tuner(capsys, "profile", "import", str(source), "--name", "abc.toml")[0] == 0
    monkeypatch.chdir(tmp_path)  # no file abc.toml here
    assert tuner(capsys, "profile", "show", "abc.toml")[0] == 0
    assert load_profile("abc.toml").setting.value == -25
    code, out, err = tuner(capsys, "--simulate", "apply", "abc.toml", "--yes")
    assert code == 0 and "applied 'abc.toml' (-25 mV" in out, err
    (tmp_path / "other.toml").write_text(sim_profile("other", value=-15).to_toml())
    assert load_profile("other.toml").setting.value == -15  # not in the store: the file, as before
    with pytest.raises(ProfileError, match="no such file"):
        load_profile("./abc.toml")  # a separator: only ever a path


def test_unknown_name():
    with pytest.raises(UsageError, match="no profile named 'nope'"):
        load_profile("nope")


def test_symlink_in_the_store_is_refused_not_followed(tmp_path):
    target = tmp_path / "elsewhere.toml"
    target.write_text(sim_profile("elsewhere").to_toml())
    store = paths.user_profiles_dir()
    store.mkdir(parents=True)
    (store / "linked.toml").symlink_to(target)
    with pytest.raises(ProfileError, match="is a symbolic link; the tuner does not follow links"):
        load_profile("linked")
    with pytest.raises(ProfileError, match="symbolic link"):
        read_profile_file(store / "linked.toml")
    good, bad = scan()
    assert good == [] and "symbolic link" in bad[0][1]
    # saving over the link is refused, even with --overwrite (issue 11: write only what we own)
    with pytest.raises(UsageError, match="already exists"):
        save_profile(sim_profile("linked"))
    before = target.read_bytes()
    with pytest.raises(UsageError, match="is a symbolic link; nothing was written"):
        save_profile(sim_profile("linked", value=-5), overwrite=True)
    assert target.read_bytes() == before
    assert (store / "linked.toml").is_symlink()


def test_fifo_and_directory_are_refused(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        read_profile_file(fifo)  # must not block waiting for a writer
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ProfileError, match="not a regular file"):
        read_profile_file(tmp_path / "dir.toml")


def test_delete_only_inside_the_store(tmp_path):
    save_profile(sim_profile("gone"))
    delete_profile("gone")
    assert list_profiles() == []
    victim = tmp_path / "victim.toml"
    victim.write_text("keep me")
    with pytest.raises(ProfileError, match="bad profile name"):
        delete_profile(f"../../{victim}")
    assert victim.read_text() == "keep me"


def test_unwritable_system_store_is_permission_denied(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setenv("TUNER_SYSTEM_PROFILES", str(locked))
    if os.geteuid() == 0:
        monkeypatch.setattr("tuner.profiles.store.write_atomic", _raise_permission)
    else:
        locked.chmod(0o500)
    with pytest.raises(PermissionDenied) as info:
        save_profile(sim_profile("boot"), system=True)
    assert "permission denied; run as root" in info.value.one_line()


def _raise_permission(*_a, **_k):
    raise PermissionError(13, "Permission denied")


CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from tests.profiles.helpers import sim_profile
    from tuner.profiles import save_profile
    real_replace = os.replace
    def replace_after_kill(src, dst):
        # The new profile is fully written and fsynced to its temp file; the rename has not happened.
        print("WRITTEN", src, flush=True)
        time.sleep(600)
        real_replace(src, dst)
    os.replace = replace_after_kill
    save_profile(sim_profile("precious", value=-70), overwrite=True)
""")


def test_sigkill_between_write_and_rename_leaves_the_old_file_intact():
    old = sim_profile("precious", value=-45)
    path = save_profile(old)
    before = path.read_bytes()
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=str(REPO))], stdout=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    try:
        line = child.stdout.readline()
        assert line.startswith("WRITTEN"), line
        temp = line.split(" ", 1)[1].strip()
        assert os.path.exists(temp) and "-70" in Path(temp).read_text()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert path.read_bytes() == before
    assert load_profile("precious") == old
    assert [p.name for p in list_profiles()] == ["precious"]  # the leftover temp file is not listed

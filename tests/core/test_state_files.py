"""The tuner's own files are never written through a planted link or a directory others can write (issue 28,
item 3): tuner.core.state_files, used by the card lock, write_atomic and append_durable."""

from __future__ import annotations

import grp
import json
import os

import pytest

from tests.cli_helpers import run_tuner
from tuner.core import paths, state_files
from tuner.core.atomic import append_durable, write_atomic
from tuner.core.card_lock import CardLock, LockUnavailable, lock_path


@pytest.fixture
def precious(tmp_path):
    path = tmp_path / "precious"
    path.write_text("the user's file\n")
    return path


def _one_line_error(proc, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], proc.stderr


def test_set_refuses_a_lock_file_that_is_a_link_and_leaves_its_target_alone(precious):
    link = lock_path("sim0")
    link.parent.mkdir(parents=True)
    link.symlink_to(precious)
    proc = run_tuner("--simulate", "set", "--device", "sim0", "--offset", "-30", "--yes")
    _one_line_error(proc, 2, str(link), "symbolic link")
    assert precious.read_text() == "the user's file\n"
    assert json.loads(run_tuner("--simulate", "status", "--json").stdout)["devices"][0]["knob"]["current"] == 0


def test_appends_and_atomic_writes_in_the_state_never_go_through_a_link(precious):
    log = paths.state_dir() / "journal" / "sim0.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(precious)
    with pytest.raises(state_files.UnsafeStatePath, match="symbolic link"):
        append_durable(log, "{}")
    journal = paths.state_dir() / "journal" / "sim0.json"
    journal.symlink_to(precious)
    with pytest.raises(state_files.UnsafeStatePath, match="symbolic link"):
        write_atomic(journal, b"{}")
    assert precious.read_text() == "the user's file\n" and journal.is_symlink() and log.is_symlink()


def test_a_directory_below_the_state_root_may_not_be_a_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths.state_dir().mkdir(parents=True)
    (paths.state_dir() / "locks").symlink_to(elsewhere)
    with pytest.raises(LockUnavailable, match="locks is a symbolic link"):
        CardLock("sim0").acquire()
    assert list(elsewhere.iterdir()) == []


def test_a_state_directory_others_can_write_is_refused():
    directory = paths.state_dir() / "journal"
    state_files.ensure_dir(directory)
    assert os.stat(directory).st_mode & 0o777 == 0o700  # what the tuner makes
    os.chmod(directory, 0o777)
    with pytest.raises(state_files.UnsafeStatePath, match=r"writable by other users \(mode 0777\).*chmod go-w"):
        append_durable(directory / "sim0.log", "{}")
    assert not (directory / "sim0.log").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's group or owner needs root")
def test_group_writable_is_refused_unless_it_is_the_users_private_group():
    directory = paths.state_dir()
    state_files.ensure_dir(directory)
    os.chmod(directory, 0o770)
    state_files.check_dir(directory)  # root:root, root's own primary group of its own name
    other = next(g for g in grp.getgrall() if g.gr_gid != os.getegid())
    os.chown(directory, -1, other.gr_gid)
    with pytest.raises(state_files.UnsafeStatePath, match="writable by other users"):
        state_files.check_dir(directory)
    os.chown(directory, 65534, os.getegid())
    os.chmod(directory, 0o700)
    with pytest.raises(state_files.UnsafeStatePath, match="belongs to"):
        state_files.check_dir(directory)


def test_locks_being_a_file_is_one_line_and_exit_2():
    paths.state_dir().mkdir(parents=True)
    (paths.state_dir() / "locks").write_text("not a directory\n")
    proc = run_tuner("--simulate", "set", "--device", "sim0", "--offset", "-30", "--yes")
    _one_line_error(proc, 2, "locks is not a directory")


def test_paths_outside_the_state_are_not_the_state_checks_business(tmp_path):
    """A report or an exported profile goes where the user says (the profile store checks its own writes)."""
    target = tmp_path / "shared"
    target.mkdir(mode=0o777)
    os.chmod(target, 0o777)
    write_atomic(target / "report.json", b"{}")
    assert (target / "report.json").read_bytes() == b"{}"


def test_a_fifo_or_a_link_at_a_journal_or_the_unsafe_list_is_one_line_not_a_hang(precious):
    """`unsafe list` reads the unsafe list, `status` the journal (its open trial): each says what is wrong."""
    from tuner.tuning import journal

    for path, command in ((journal.unsafe_path("sim0"), ("unsafe", "list")), (journal.journal_path("sim0"),
                                                                             ("status",))):
        path.parent.mkdir(parents=True, exist_ok=True)
        for plant, problem in (("fifo", "not a regular file"), ("link", "symbolic link")):
            os.mkfifo(path) if plant == "fifo" else path.symlink_to(precious)
            proc = run_tuner("--simulate", *command, timeout=60)
            assert "Traceback" not in proc.stderr and str(path) in proc.stderr and problem in proc.stderr, \
                proc.stderr
            assert proc.returncode == (2 if command[0] == "unsafe" else 0)  # status warns, and goes on
            path.unlink()
    assert precious.read_text() == "the user's file\n"

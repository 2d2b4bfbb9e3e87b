"""One writer per card: a second writer is refused with the holder named; a dead holder blocks nobody."""

import subprocess
import sys
import textwrap

import pytest

from tuner.core import exit_codes
from tuner.core.card_lock import CardBusy, CardLock


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def _holder(tmp_path, device="sim0"):
    """Another process that takes the lock and waits until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        from tuner.core.card_lock import CardLock
        with CardLock({device!r}, "tuner bisect --device {device}"):
            print("held", flush=True)
            sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={"XDG_STATE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_with_the_holders_pid_and_command(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(CardBusy) as err, CardLock("sim0", "tuner set --offset -30"):
            pass
        assert f"pid {proc.pid}" in err.value.message and "tuner bisect --device sim0" in err.value.message
        assert err.value.exit_code == exit_codes.BUSY
        with CardLock("sim1"):  # another card is free
            pass
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_a_killed_holder_releases_the_card(tmp_path):
    proc = _holder(tmp_path)
    proc.kill()
    proc.wait(10)
    with CardLock("sim0"):  # acquired (CardBusy otherwise)
        pass


def test_one_writer_per_card_inside_one_process_too():
    with CardLock("sim0", "an auto-bisect"), pytest.raises(CardBusy, match="an auto-bisect"):
        CardLock("sim0").acquire()
    with CardLock("sim0"):  # released on exit
        pass

"""A real terminal: `tuner --simulate` under tmux at 80x24, every screen by key, captured, then a clean quit.

Set TUNER_SMOKE_CAPTURE_DIR to keep the captured panes (the report pastes them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed, so there is no real terminal to test in")

EXPECT = {  # key -> text that must be on that screen
    "1": ["[1 Dashboard]", "SIMULATED", "setting +0 mV", "· idle", "power W"],
    "2": ["[2 Tune]", "target +0 mV", "detectors:"],
    "3": ["[3 Bisect]", "setting", "verdict", "tok/J"],
    "4": ["[4 Profiles]", "no profiles yet"],
    "5": ["[5 Doctor]"],
    "6": ["[6 Help]", "Safety model"],
}


def _tmux(sock: Path, *args: str) -> str:
    return subprocess.run([TMUX, "-S", str(sock), *args], capture_output=True, text=True, check=True).stdout


def _card(rig: Path, device_id: str) -> dict:
    """A simulated card's record as the tuner left it on disk ({}: never written, stock)."""
    import json

    path = rig / f"{device_id}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _wait_for(sock: Path, texts: list[str], timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    pane = ""
    while time.monotonic() < deadline:
        pane = _tmux(sock, "capture-pane", "-p", "-t", "smoke")
        if all(t in pane for t in texts):
            return pane
        time.sleep(0.2)
    raise AssertionError(f"never saw {texts!r}; last pane:\n{pane}")


def _start_tuner(tmp_path: Path, *, then: str = "; echo TUNER-EXIT=$?; sleep 30", args: str = "",
                 size: tuple[int, int] = (80, 24)) -> Path:
    """`tuner --simulate` at 80x24 (or `size`) in a private tmux server (with the test's XDG dirs); returns its
    socket. `then` runs in the pane after the tuner exits, so the exit code can be read from the pane."""
    sock = tmp_path / "tmux.sock"
    tuner = Path(sys.executable).with_name("tuner")
    env_vars = " ".join(f"{k}={os.environ[k]}" for k in ("XDG_STATE_HOME", "XDG_CONFIG_HOME"))
    _tmux(sock, "new-session", "-d", "-s", "smoke", "-x", str(size[0]), "-y", str(size[1]),
          # COLUMNS/LINES, if the test process has them (80x24), would override the pane's size for Textual
          f"env -u COLUMNS -u LINES {env_vars} TERM=xterm-256color {tuner} --simulate{args}{then}")
    return sock


def test_tuner_simulate_under_tmux(tmp_path):
    sock = _start_tuner(tmp_path)
    keep = os.environ.get("TUNER_SMOKE_CAPTURE_DIR")
    try:
        _wait_for(sock, EXPECT["1"])
        for key, texts in EXPECT.items():
            _tmux(sock, "send-keys", "-t", "smoke", key)
            pane = _wait_for(sock, texts)
            lines = pane.splitlines()
            assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"screen-{key}.txt").write_text(pane)
        _tmux(sock, "send-keys", "-t", "smoke", "q")
        pane = _wait_for(sock, ["TUNER-EXIT=0"])
        assert "Traceback" not in pane
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


FOOTER = {  # key -> every key the screen has, as the footer (the last lines of the pane) must show it
    "1": [],
    "2": ["←/→ Step", "PgDn/PgUp 5 steps", "a Apply", "r Reset to stock", "s Stress on/off", "m Mode", "p Preset"],
    "3": ["b Start", "x Stop", "u Resume", "n Restart", "a Apply result", "v Save", "e Export", "f Form",
          "g Plot/table"],
    "4": ["a Apply", "e Export", "i Import", "Del Delete", "l Reload"],  # b: not in a simulated session
    "5": ["r Run again"],
    "6": [],
}
MANY_CARDS = {  # the keys a screen adds with two or more cards (with one they would do nothing: not shown)
    "1": ["d Next card"], "2": ["d Next card"], "3": ["d Next card", "c Card table"], "4": ["d Next card"],
}


def test_at_60x20_the_terminal_is_too_small_in_one_line_and_simulated_stays(tmp_path):
    """Below 80x24 nothing was said: the header dropped SIMULATED and forms were cut. Now every screen shows its
    top line (SIMULATED included) and one line saying so; growing the terminal brings the screen back."""
    sock = _start_tuner(tmp_path, size=(60, 20))
    keep = os.environ.get("TUNER_SMOKE_CAPTURE_DIR")
    notice = "terminal 60x20: tuner needs 80x24; enlarge it (q quits)"
    try:
        for key in "142":
            _tmux(sock, "send-keys", "-t", "smoke", key)
            pane = _wait_for(sock, [notice, "SIMULATED"])
            lines = pane.rstrip("\n").splitlines()
            assert "SIMULATED" in lines[0] and lines[1].strip() == notice
            assert not any(line.strip() for line in lines[2:]), pane
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"60x20-screen-{key}.txt").write_text(pane)
        _tmux(sock, "resize-window", "-t", "smoke", "-x", "80", "-y", "24")
        _wait_for(sock, ["[2 Tune]", "target +0 mV", "q Quit"])
        _tmux(sock, "send-keys", "-t", "smoke", "q")
        _wait_for(sock, ["TUNER-EXIT=0"])
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


def test_every_footer_shows_its_keys_and_quit_at_80x24(tmp_path):
    """Textual's footer cut keys past column 80 (`q` first); every screen's keys must be readable in a real
    terminal, whole, with `q Quit` and the palette."""
    sock = _start_tuner(tmp_path)
    try:
        _wait_for(sock, EXPECT["1"])
        for key, keys in FOOTER.items():
            _tmux(sock, "send-keys", "-t", "smoke", key)
            pane = _wait_for(sock, EXPECT[key])
            footer = "\n".join(pane.rstrip("\n").splitlines()[-3:])
            for item in [*keys, "q Quit", "^p Palette"]:
                assert item in footer, f"screen {key}: {item!r} not in the footer:\n{footer}"
            for item in MANY_CARDS.get(key, []):
                assert item not in footer, f"screen {key}: {item!r} offered with one card:\n{footer}"
            assert "paletteD" not in pane and "palettee" not in pane
        _tmux(sock, "send-keys", "-t", "smoke", "q")
        _wait_for(sock, ["TUNER-EXIT=0"])
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


def test_three_cards_fit_80x24_on_every_screen_with_every_key(tmp_path):
    """`tuner --simulate --sim-gpus 3`: the dashboard's row per card and the Bisect screen's ALL CARDS target fit
    80x24 and every footer still shows its keys and `q`."""
    sock = _start_tuner(tmp_path, args=" --sim-gpus 3")
    try:
        pane = _wait_for(sock, ["[1 Dashboard]", "▶ sim0", "sim1", "sim2", "STOCK", "idle"])
        assert sum("SIMULATED" in line for line in pane.splitlines()) >= 4  # the badge and every card's row
        for key, keys in FOOTER.items():
            _tmux(sock, "send-keys", "-t", "smoke", key)
            pane = _wait_for(sock, EXPECT[key][:1])
            lines = pane.rstrip("\n").splitlines()
            assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
            footer = "\n".join(lines[-3:])
            for item in [*keys, *MANY_CARDS.get(key, []), "q Quit", "^p Palette"]:
                assert item in footer, f"screen {key}: {item!r} not in the footer:\n{footer}"
        _tmux(sock, "send-keys", "-t", "smoke", "3")
        for _ in range(3):
            _tmux(sock, "send-keys", "-t", "smoke", "d")
        pane = _wait_for(sock, ["ALL CARDS (sim0, sim1, sim2)", "▶ sim0", "c Card table", "q Quit"])
        assert all(len(line) <= 80 for line in pane.splitlines())
        _tmux(sock, "send-keys", "-t", "smoke", "q")
        _wait_for(sock, ["TUNER-EXIT=0"])
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


def test_ssh_hang_up_reverts_an_unconfirmed_setting(tmp_path):
    """Apply -10 mV, leave the keep-or-revert dialog open, then SIGHUP the tuner: the card must be at stock."""
    import signal

    import psutil

    sock = _start_tuner(tmp_path)
    state = Path(os.environ["XDG_STATE_HOME"]) / "tuner-simulated" / "seed-0"
    try:
        _wait_for(sock, EXPECT["1"])
        _tmux(sock, "send-keys", "-t", "smoke", "2")
        _wait_for(sock, EXPECT["2"])
        _tmux(sock, "send-keys", "-t", "smoke", "Left")
        _tmux(sock, "send-keys", "-t", "smoke", "Left")
        _wait_for(sock, ["target -10 mV"])
        _tmux(sock, "send-keys", "-t", "smoke", "a")
        _wait_for(sock, ["Keep this setting?"])
        assert _card(state, "sim0").get("offset_mv", 0) == -10
        shell_pid = int(_tmux(sock, "list-panes", "-t", "smoke", "-F", "#{pane_pid}").strip())
        [app_proc] = [p for p in psutil.Process(shell_pid).children(recursive=True) if "tuner" in " ".join(p.cmdline())]
        app_proc.send_signal(signal.SIGHUP)
        _wait_for(sock, ["TUNER-EXIT=130"])
        assert _card(state, "sim0").get("offset_mv", 0) == 0
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


def test_ssh_hang_up_reverts_every_card_of_an_unconfirmed_rig_apply(tmp_path):
    """The rig half of the test above, in a real process (the rig rules table calls the handler run_app installs
    by hand; here the real signal goes through whatever the process has installed): a rig profile applied to three
    cards from the Profiles screen, its one keep-or-revert open, then SIGHUP: every card must be back at stock."""
    import signal

    import psutil

    from tuner.backends.simulated import SimulatedBackend
    from tuner.profiles import RigPart, build_rig_profile, save_profile

    cards = SimulatedBackend(gpus=3, state_path=tmp_path / "proven-on.json")
    save_profile(build_rig_profile("rig", [RigPart(d, cards.knob(d.id), v) for d, v in
                                           zip(cards.devices(), (-40, -55, -30), strict=True)],
                                   rig={"backend": "gloo", "attempts": 1}, kernel="6.14.0-test"))
    sock = _start_tuner(tmp_path, args=" --sim-gpus 3")
    state = Path(os.environ["XDG_STATE_HOME"]) / "tuner-simulated" / "seed-0"

    def offsets() -> list[int]:
        return [_card(state, f"sim{i}").get("offset_mv", 0) for i in range(3)]

    try:
        _wait_for(sock, ["[1 Dashboard]", "sim2"])
        _tmux(sock, "send-keys", "-t", "smoke", "4")
        _wait_for(sock, ["[4 Profiles]", "rig"])
        _tmux(sock, "send-keys", "-t", "smoke", "a")
        _wait_for(sock, ["Keep all of"])
        assert offsets() == [-40, -55, -30]
        shell_pid = int(_tmux(sock, "list-panes", "-t", "smoke", "-F", "#{pane_pid}").strip())
        [app_proc] = [p for p in psutil.Process(shell_pid).children(recursive=True) if "tuner" in " ".join(p.cmdline())]
        app_proc.send_signal(signal.SIGHUP)
        _wait_for(sock, ["TUNER-EXIT=130"])
        assert offsets() == [0, 0, 0]
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


def test_terminal_gone_during_a_bisect_stops_everything_and_leaves_the_card_at_stock(tmp_path):
    """The SSH connection drops mid-bisect (the terminal disappears): the UI and the engine must exit and the card
    must be at stock, with no process left spinning on a dead terminal."""

    import psutil

    sock = _start_tuner(tmp_path, then="")  # the pane (the "terminal") closes with the tuner
    state = Path(os.environ["XDG_STATE_HOME"]) / "tuner-simulated" / "seed-0"
    try:
        _wait_for(sock, EXPECT["1"])
        _tmux(sock, "send-keys", "-t", "smoke", "3")
        _wait_for(sock, EXPECT["3"])
        _tmux(sock, "send-keys", "-t", "smoke", "b")
        _wait_for(sock, ["RUNNING", "baseline"])
        shell_pid = int(_tmux(sock, "list-panes", "-t", "smoke", "-F", "#{pane_pid}").strip())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            procs = [*psutil.Process(shell_pid).children(recursive=True), psutil.Process(shell_pid)]
            if any("tuner.engine" in " ".join(p.cmdline()) for p in procs):
                break
            time.sleep(0.2)
        assert any("tuner.engine" in " ".join(p.cmdline()) for p in procs), "the bisect never started the engine"
    finally:
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)
    _gone, alive = psutil.wait_procs(procs, timeout=20)
    assert not alive, f"still running after the terminal went away: {[p.cmdline() for p in alive]}"
    card = _card(state, "sim0")
    assert card.get("offset_mv", 0) == 0 and "load_pid" not in card

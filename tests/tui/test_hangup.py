"""The terminal goes away under a running UI (issue 28, item 7): the cards end at stock and the process ends, 130.

Found in the field: `tuner --simulate` UIs alive 40 minutes after their tmux server was killed, deaf to SIGTERM,
the main thread blocked in Textual's `WriterThread.stop` -> `queue.put` on a full queue. Each test here runs the
real `tuner --simulate` on a pseudo-terminal (or in tmux) and takes the terminal away as an SSH drop does: the
pty's master closed (with and without the SIGHUP a controlling terminal brings), or a terminal that stops reading
and then SIGTERM, or a storm of signals; while a keep-or-revert is open, or while a bisect runs its engine.
Before the fix each one hung (killed by the test after its bound) with the card left at the unconfirmed value.
The two whose terminal stops reading run the same entry point with one of the product's waits shortened
(`_short_waits`), a wait their assertions do not measure; one of them also ends the keep-or-revert countdown once
the UI is blocked rather than waiting out its 15 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest

from tests.cli_helpers import REPO
from tests.polling import wait_until
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes

TUNER = Path(sys.executable).with_name("tuner")
EXIT_BOUND_S = 90.0  # generous: make_safe, then at most the guard's grace (10 s), on a busy 2-core machine
ANSI = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def _short_waits(*, overdue_s: float | None = None, grace_s: float | None = None,
                 countdown_ends_on: Path | None = None) -> list[str]:
    """`tuner` as its console script runs it (tuner.cli.main), with the App's OVERDUE_S (how long a keep-or-revert
    may stay pending past its countdown before the guard's thread reverts it for a stuck event loop; 5 s) or the
    hang-up guard's grace (how long the process may take to end by itself once the cards are safe; 10 s) shorter,
    or (`countdown_ends_on`) a keep-or-revert countdown whose clock moves past its 15 s once that file exists, so
    the test ends the countdown at a state it chose (the UI blocked) instead of waiting it out.
    Which path runs, and its end state, are the product's own; only the idle wait before it is shorter."""
    code = ["import sys", "from tuner.app import hangup, tuner_app", "from tuner.cli import main",
            "sys.argv[0] = 'tuner'"]
    if overdue_s is not None:
        code += [f"assert tuner_app.OVERDUE_S > {overdue_s!r}", f"tuner_app.OVERDUE_S = {overdue_s!r}"]
    if countdown_ends_on is not None:
        code += ["import os",
                 "from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S",
                 "prepare_setting = tuner_app.prepare_setting",
                 "def prepare(backend, request, *, clock, **kwargs):",
                 f"    def moved() -> float:  # past the countdown's end once {str(countdown_ends_on)!r} exists",
                 f"        return clock() + (DEFAULT_TIMEOUT_S if os.path.exists({str(countdown_ends_on)!r}) else 0.0)",
                 "    return prepare_setting(backend, request, clock=moved, **kwargs)",
                 "tuner_app.prepare_setting = prepare"]
    if grace_s is not None:
        code += ["assert tuner_app.HangUpGuard is hangup.HangUpGuard",
                 "class Guard(hangup.HangUpGuard):",
                 "    def __init__(self, **kwargs):",
                 f"        assert {grace_s!r} < hangup.EXIT_GRACE_S and 'grace_s' not in kwargs",
                 f"        super().__init__(grace_s={grace_s!r}, **kwargs)",
                 "tuner_app.HangUpGuard = Guard"]
    code.append("sys.exit(main())")
    return [sys.executable, "-c", "\n".join(code)]


def _card_offset(device_id: str = "sim0") -> int:
    """The simulated card as the next tuner process would read it (the same XDG state as the UI's)."""
    return SimulatedBackend().knob(device_id).current


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyTuner:
    """`tuner --simulate` on a pseudo-terminal of its own (80x24). `controlling`: the pty is the process's
    controlling terminal (it is the session leader, as a login shell's child is after `exec`), so closing the
    master hangs it up with SIGHUP and SIGCONT; without it nothing is signalled and only writes fail."""

    def __init__(self, *args: str, controlling: bool = True, command: list[str] | None = None):
        self.master, slave = os.openpty()
        _set_size(slave, 24, 80)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        if command is not None:  # the checkout's tuner, as tests.cli_helpers runs it
            env["PYTHONPATH"] = str(REPO)

        def session() -> None:
            os.setsid()
            if controlling:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([*(command or [str(TUNER)]), "--simulate", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, preexec_fn=session, close_fds=True)
        os.close(slave)
        self.raw = b""
        self.master_open = True

    @property
    def text(self) -> str:
        return ANSI.sub(b"", self.raw).decode("utf-8", "replace")

    def read_for(self, timeout_s: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if ready:
            try:
                self.raw += os.read(self.master, 1 << 16)
            except OSError:  # EIO: the process has gone and closed the slave
                pass

    def wait_for(self, *texts: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(t in self.text[-20000:] for t in texts):
                self.raw = self.raw[-20000:]
                return
            if self.proc.poll() is not None:
                break
            self.read_for(0.2)
        raise AssertionError(f"never saw {texts!r} (exit {self.proc.poll()}); last output:\n{self.text[-2000:]}")

    def press(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close_master(self) -> None:
        """The SSH session (or tmux) goes away: the pty's master is closed."""
        os.close(self.master)
        self.master_open = False

    def drain(self) -> None:
        """Keep reading while the process ends (a terminal that is still there)."""
        while self.master_open and self.proc.poll() is None:
            self.read_for(0.2)

    def wait_exit(self, timeout_s: float = EXIT_BOUND_S, *, reading: bool = True) -> int:
        """The exit code, or fail with where its threads are blocked (the hang) after killing it. `reading`: the
        terminal still takes output meanwhile (False: it stays stalled)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.master_open and reading:
                self.read_for(0.2)
            else:
                time.sleep(0.2)
            code = self.proc.poll()
            if code is not None:
                return code
        where = _thread_states(self.proc.pid)
        self.kill()
        raise AssertionError(f"tuner still running {timeout_s:.0f} s after the terminal went away: {where}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.master_open:
            os.close(self.master)
            self.master_open = False


def _thread_states(pid: int) -> list[str]:
    states = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            states.append(f"{task.name}:{(task / 'wchan').read_text()}")
        except OSError:
            pass
    return states


def _shell_state(pid: int) -> str:
    """A wrapper shell's status, its threads' wait channels and its children, for a failure message."""
    try:
        shell = psutil.Process(pid)
        children = []
        for c in shell.children():
            with contextlib.suppress(psutil.Error):
                children.append((c.pid, c.status(), c.cmdline()[:3]))
        return f"{shell.status()} {_thread_states(pid)}, its children {children}"
    except psutil.Error as e:
        return f"unknown ({e!r})"


@pytest.fixture
def tuners():
    started: list[PtyTuner] = []

    def start(*args: str, controlling: bool = True, command: list[str] | None = None) -> PtyTuner:
        tuner = PtyTuner(*args, controlling=controlling, command=command)
        started.append(tuner)
        return tuner

    yield start
    for tuner in started:
        tuner.kill()


def _open_keep_or_revert(tuner: PtyTuner) -> None:
    """Tune screen, -10 mV, apply: the keep-or-revert dialog is open and the card holds the unconfirmed -10."""
    tuner.wait_for("Dashboard", "SIMULATED")
    tuner.press("2")
    tuner.wait_for("target +0 mV")
    tuner.press("\x1b[D")
    tuner.press("\x1b[D")
    tuner.wait_for("target -10 mV")
    tuner.press("a")
    tuner.wait_for("Keep this setting?")
    assert _card_offset() == -10


@pytest.mark.parametrize("controlling", [True, False], ids=["sighup", "no-signal"])
def test_terminal_gone_during_keep_or_revert_reverts_and_exits_130(tuners, controlling):
    """The pty's master closes while the dialog counts down. As the controlling terminal: SIGHUP and SIGCONT
    arrive (Textual's SIGCONT handler restarted its writer on the dead terminal, and the shutdown blocked for
    good). Without one: no signal at all, only failing writes (Textual's writer thread died, the UI froze on its
    next 30 writes). Either way the card must be back at stock and the process gone with 130."""
    tuner = tuners(controlling=controlling)
    _open_keep_or_revert(tuner)
    tuner.close_master()
    assert tuner.wait_exit() == exit_codes.INTERRUPTED
    assert _card_offset() == 0


def _main_thread_blocked(pid: int) -> bool:
    """The UI's main thread sleeps on a lock (Textual's full write queue), not in its event loop's epoll."""
    try:
        return "futex" in Path(f"/proc/{pid}/task/{pid}/wchan").read_text()
    except OSError:
        return False


def _stall(tuner: PtyTuner) -> None:
    """The terminal stops reading (a stalled SSH connection): full repaints at a large size, unread, until the
    UI's event loop blocks on its output (Textual's writer blocked in write(), its queue of 30 full)."""
    blocked_since = None
    deadline = time.monotonic() + 60
    rows = 60
    while time.monotonic() < deadline:  # full repaints at a large size until the UI blocks on its output
        rows = 121 - rows
        _set_size(tuner.master, rows, 200)
        tuner.proc.send_signal(signal.SIGWINCH)
        time.sleep(0.1)
        if not _main_thread_blocked(tuner.proc.pid):
            blocked_since = None
        elif blocked_since is None:
            blocked_since = time.monotonic()
        elif time.monotonic() - blocked_since > 2.0:
            break
    else:
        pytest.fail(f"the UI never blocked on its output: {_thread_states(tuner.proc.pid)}")


def test_sigterm_with_a_terminal_that_stopped_reading_reverts_and_exits_130(tuners):
    """A terminal that takes no more output: the event loop is blocked on it. SIGTERM then: the old handler only
    asked that blocked event loop to leave, so it was ignored. Now the guard makes the card safe and ends the
    process (130) once its grace is over (1 s here: the blocked UI cannot end by itself in any grace)."""
    tuner = tuners(command=_short_waits(grace_s=1.0))
    _open_keep_or_revert(tuner)
    _stall(tuner)
    assert _card_offset() == -10
    tuner.proc.send_signal(signal.SIGTERM)
    code = tuner.wait_exit(reading=False)
    assert code == exit_codes.INTERRUPTED
    assert _card_offset() == 0


@pytest.mark.heavy(seconds=20)
def test_a_terminal_that_stopped_reading_cannot_hold_an_unconfirmed_setting(tuners, tmp_path):
    """No signal at all: the terminal just stops reading while the keep-or-revert counts down. The countdown runs
    on the blocked event loop, so the unconfirmed -10 mV stayed on the card as long as the stall lasted. Now it is
    reverted soon after its 15 s (the guard's thread reverts what is still pending OVERDUE_S later: 1 s here, 5 s
    in the product), and the UI carries on when the terminal reads again. The 15 s end here once the UI is seen
    blocked (the countdown's clock is moved past them: `_short_waits`), not after 15 s of waiting; the countdown
    still ends during the stall, as in the field."""
    expire = tmp_path / "countdown-over"
    tuner = tuners(command=_short_waits(overdue_s=1.0, countdown_ends_on=expire))
    _open_keep_or_revert(tuner)
    _stall(tuner)
    assert _card_offset() == -10  # still there once the UI is blocked: what reverts it now is the guard's thread
    expire.touch()  # the countdown is over, with the event loop that runs it still blocked
    deadline = time.monotonic() + EXIT_BOUND_S
    while _card_offset() != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _card_offset() == 0, "the unconfirmed setting stayed on the card while the terminal was stalled"
    assert tuner.proc.poll() is None  # nothing else happened: the UI is still there
    tuner.wait_for("not confirmed in time")  # reading again: the UI moves on and says what happened
    tuner.press("q")
    assert tuner.wait_exit() == exit_codes.OK
    assert _card_offset() == 0


def test_a_signal_storm_reverts_and_exits_130_without_a_traceback(tuners):
    """HUP, TERM, INT, QUIT, USR1... in a burst while the dialog is open (issue 28, item 7: the card was reverted
    but the process died by the signal or with a traceback): one exit, 130, card at stock, nothing raised."""
    tuner = tuners()
    _open_keep_or_revert(tuner)
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM, signal.SIGPIPE, signal.SIGTERM, signal.SIGHUP):
        if tuner.proc.poll() is not None:
            break
        tuner.proc.send_signal(sig)
    assert tuner.wait_exit() == exit_codes.INTERRUPTED
    assert _card_offset() == 0
    tuner.drain()
    assert "Traceback" not in tuner.text
    assert "reverted the unconfirmed setting on sim0" in tuner.text


def test_signals_until_the_end_still_end_with_130(tuners):
    """A storm that lasts until the process is gone (the late ones land during its exit, when Python resets its
    handlers): never killed by a signal, always 130, the card at stock."""
    tuner = tuners()
    _open_keep_or_revert(tuner)
    storm = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGPIPE, signal.SIGQUIT)
    deadline = time.monotonic() + EXIT_BOUND_S
    sent = 0
    while tuner.proc.poll() is None and time.monotonic() < deadline:
        try:
            tuner.proc.send_signal(storm[sent % len(storm)])
        except ProcessLookupError:
            break
        sent += 1
        tuner.read_for(0.002)
    assert tuner.wait_exit() == exit_codes.INTERRUPTED, f"after {sent} signals"
    assert _card_offset() == 0


def _stopped(tuner: PtyTuner) -> bool:
    try:
        return psutil.Process(tuner.proc.pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def test_sigtstp_during_keep_or_revert_reverts_before_the_process_stops(tuners):
    """`kill -TSTP` (or Ctrl-Z through a key binding) while a change waits for keep-or-revert: Textual's driver
    stopped the process at once, and the unconfirmed -10 mV stayed on the card, unwatched, for as long as it stayed
    stopped (`tuner set` reverts first, tuner.core.signals STOP_SIGNALS). Now the card is back before the process
    stops, and after SIGCONT the UI carries on and says what happened."""
    tuner = tuners(command=_short_waits())  # the checkout's tuner
    _open_keep_or_revert(tuner)
    tuner.proc.send_signal(signal.SIGTSTP)
    wait_until(lambda: _stopped(tuner) or tuner.proc.poll() is not None, EXIT_BOUND_S, "the process to stop")
    assert _stopped(tuner)
    assert _card_offset() == 0, "the unconfirmed setting stayed on the card while the process was stopped"
    tuner.proc.send_signal(signal.SIGCONT)
    tuner.wait_for("reverted")  # back: the UI moves on and says what happened
    assert tuner.proc.poll() is None

    def quit_heard() -> bool:
        # Textual takes the terminal back (raw mode) on SIGCONT in its own time: a key typed before that is read by
        # the cooked terminal, so quit is asked until the tuner hears it (each `q` asks the same thing)
        tuner.press("q")
        tuner.read_for(1.0)
        return tuner.proc.poll() is not None

    wait_until(quit_heard, EXIT_BOUND_S, "the tuner to quit after SIGCONT")
    assert tuner.wait_exit() == exit_codes.OK
    assert _card_offset() == 0


@pytest.mark.parametrize("stop", [signal.SIGTTIN, signal.SIGTTOU], ids=["SIGTTIN", "SIGTTOU"])
def test_a_terminal_stop_during_keep_or_revert_reverts_before_the_process_stops(tuners, stop):
    """SIGTTIN/SIGTTOU, the kernel's stop for a background job that reads its terminal or sets its modes (after
    `kill -STOP` then `bg`, the UI runs on in the background): the driver handled only SIGTSTP, so the default
    action stopped the process at once with the unconfirmed -10 mV on the card, unwatched (`tuner set` reverts
    first on both, tuner.core.signals STOP_SIGNALS). The same safe stop as SIGTSTP now (its return on SIGCONT:
    test_sigtstp_during_keep_or_revert_reverts_before_the_process_stops)."""
    # under a job-control shell, as a user runs it: a process group whose parent shares its session (the kernel
    # discards these stops for an orphaned group, as the session leader PtyTuner starts alone would be); the shell
    # stays (a shell that exits orphans the stopped group: the kernel hangs it up)
    tuner = tuners(command=["bash", "-c", 'set -m; "$@"; sleep 600', "bash", *_short_waits()])
    _open_keep_or_revert(tuner)
    [ui] = psutil.Process(tuner.proc.pid).children()
    try:
        ui.send_signal(stop)
        wait_until(lambda: ui.status() == psutil.STATUS_STOPPED, EXIT_BOUND_S, "the process to stop")
        assert _card_offset() == 0, "the unconfirmed setting stayed on the card while the process was stopped"
    finally:
        ui.kill()


def _engine_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            mine = (proc.info["environ"] or {}).get("XDG_STATE_HOME") == os.environ["XDG_STATE_HOME"]
        except (psutil.Error, TypeError):
            continue
        if "tuner.engine" in cmdline and mine:
            found.append(proc)
    return found


def _bisect_until_a_trial_below_stock(tuner: PtyTuner) -> tuple[list[psutil.Process], int]:
    """Start a bisect from the Bisect screen and wait for the baseline at stock, then the first trial below stock
    with its engine running: (the engines, the trial's setting)."""
    tuner.wait_for("Dashboard", "SIMULATED")
    tuner.press("3")
    tuner.wait_for("verdict", "tok/J", "b start")
    tuner.press("b")
    tuner.wait_for("RUNNING")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (_card_offset() < 0 and _engine_processes()):
        tuner.read_for(0.2)
    engines, cut_at = _engine_processes(), _card_offset()
    assert engines and cut_at < 0, "the bisect never ran a trial below stock"
    return engines, cut_at


def test_terminal_gone_during_a_bisect_stops_the_engine_and_the_trial_runs_again(tuners):
    """An SSH drop mid-bisect (the master closed under the busy Bisect screen): the engine's process group is
    killed, the card is at stock, the process ends with 130, and the trial cut short counts for nothing: nothing
    on the unsafe list, no failure recorded, the session resumable (the trial runs again)."""
    from tuner.app import form_memory
    from tuner.tuning import journal

    # short trials: the cut comes in the third (the first below stock); the two before it, the stock baseline and its
    # replay, pass however short (no least number of compared steps at stock: tuner.tuning.evidence.judge)
    form_memory.remember(SimulatedBackend().devices()[0], {"trial": "1s", "confirm": "1s"})
    tuner = tuners("--sim-vmin", "-52")
    engines, cut_at = _bisect_until_a_trial_below_stock(tuner)
    tuner.close_master()
    assert tuner.wait_exit() == exit_codes.INTERRUPTED
    _gone, alive = psutil.wait_procs(engines, timeout=30)
    assert not alive, f"engine left running: {[p.pid for p in alive]}"
    assert _card_offset() == 0
    assert journal.unsafe_entries("sim0") == []
    session = journal.load("sim0")
    assert session is not None and session["state"] == journal.INTERRUPTED and session["open_trial"] is None
    recorded = [(t["setting"], t["verdict"]) for t in session["trials"]]
    assert all(verdict == "pass" for _setting, verdict in recorded), recorded
    assert cut_at not in [setting for setting, _verdict in recorded], recorded  # not counted: it runs again


def test_sigtstp_during_a_bisect_pauses_it_at_stock_before_the_process_stops(tuners):
    """`kill -TSTP` mid-trial: Textual stopped the process at once, the trial's setting left on the card and its
    engine (in a session of its own) loading it, unwatched. Now the bisect pauses first (the trial ends without a
    result, its engine gone, the card at stock), as `tuner bisect` does; on SIGCONT the trial runs again."""
    from tuner.app import form_memory

    form_memory.remember(SimulatedBackend().devices()[0], {"trial": "1s", "confirm": "1s"})
    tuner = tuners("--sim-vmin", "-52", command=_short_waits())  # the checkout's tuner
    engines, _cut_at = _bisect_until_a_trial_below_stock(tuner)
    tuner.proc.send_signal(signal.SIGTSTP)
    wait_until(lambda: _stopped(tuner) or tuner.proc.poll() is not None, EXIT_BOUND_S, "the process to stop")
    assert _stopped(tuner)
    assert _card_offset() == 0, "the trial's setting stayed on the card while the process was stopped"
    _gone, alive = psutil.wait_procs(engines, timeout=30)
    assert not alive, f"engine left running while stopped: {[p.pid for p in alive]}"
    tuner.proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (_card_offset() < 0 and _engine_processes()):
        tuner.read_for(0.2)  # the bisect goes on: a trial below stock runs again
    assert _card_offset() < 0 and _engine_processes(), "the bisect did not go on after SIGCONT"
    assert tuner.proc.poll() is None


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_tmux_server_killed_during_keep_or_revert(tmp_path):
    """The field report itself: the UI in tmux, its server killed (-9, so tmux signals nobody; the kernel hangs the
    pane's terminal up). The process must end and the card be at stock."""
    sock = tmp_path / "tmux.sock"
    env_vars = " ".join(f"{k}={os.environ[k]}" for k in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"))

    def tmux(*args: str) -> str:
        return subprocess.run([TMUX, "-S", str(sock), *args], capture_output=True, text=True, check=True).stdout

    def wait_pane(*texts: str) -> None:
        deadline = time.monotonic() + 60
        pane = ""
        while time.monotonic() < deadline:
            pane = tmux("capture-pane", "-p", "-t", "hup")
            if all(t in pane for t in texts):
                return
            time.sleep(0.2)
        raise AssertionError(f"never saw {texts!r}; last pane:\n{pane}")

    tmux("new-session", "-d", "-s", "hup", "-x", "80", "-y", "24",
         f"exec env -u COLUMNS -u LINES {env_vars} TERM=xterm-256color {TUNER} --simulate")
    server = None
    try:
        wait_pane("Dashboard", "SIMULATED")
        [pane_pid] = tmux("list-panes", "-t", "hup", "-F", "#{pane_pid}").split()
        app = psutil.Process(int(pane_pid))
        server = psutil.Process(int(tmux("display-message", "-p", "#{pid}").strip()))
        tmux("send-keys", "-t", "hup", "2")
        wait_pane("target +0 mV")
        tmux("send-keys", "-t", "hup", "Left", "Left")
        wait_pane("target -10 mV")
        tmux("send-keys", "-t", "hup", "a")
        wait_pane("Keep this setting?")
        assert _card_offset() == -10
        server.kill()
        _gone, alive = psutil.wait_procs([app], timeout=EXIT_BOUND_S)
        if alive:
            where = _thread_states(app.pid)
            app.kill()
            raise AssertionError(f"tuner still running after its tmux server was killed: {where}")
        assert _card_offset() == 0
    finally:
        if server is not None and server.is_running():
            server.kill()
        subprocess.run([TMUX, "-S", str(sock), "kill-server"], capture_output=True, check=False)


def test_sigterm_while_the_ui_runs_in_the_background_reverts_and_exits_130(tuners, tmp_path):
    """`kill -STOP` then `bg` (the UI runs on in the background), then SIGTERM: on its way out Textual sets the
    terminal's modes back (tcsetattr), which the kernel answers with SIGTTOU for a background job, and SIGTTOU takes
    the safe stop (0381903). Quitting must still end the process, 130, the card at stock: not stopped, not hung."""
    rc = tmp_path / "rc"
    # the job-control shell of test_a_terminal_stop_during_keep_or_revert_reverts_before_the_process_stops; once the
    # UI is stopped the shell takes the terminal back and waits for the job (now in the background) to end
    tuner = tuners(command=["bash", "-c", f'set -m; "$@"; wait -f $(jobs -p); echo $? > {rc}; sleep 600', "bash",
                            *_short_waits()])
    _open_keep_or_revert(tuner)
    [ui] = psutil.Process(tuner.proc.pid).children()
    try:
        ui.send_signal(signal.SIGSTOP)
        wait_until(lambda: ui.status() == psutil.STATUS_STOPPED, EXIT_BOUND_S, "the process to stop")
        wait_until(lambda: os.tcgetpgrp(tuner.master) != ui.pid, EXIT_BOUND_S, "the shell to take the terminal")
        ui.send_signal(signal.SIGCONT)  # `bg`
        wait_until(lambda: ui.status() != psutil.STATUS_STOPPED, EXIT_BOUND_S, "the process to run in the background")
        tuner.read_for(0.5)
        ui.send_signal(signal.SIGTERM)

        def ended() -> bool:
            tuner.read_for(0.2)
            return rc.exists() and rc.read_text().strip() != ""

        try:
            wait_until(ended, EXIT_BOUND_S, "the tuner to end")
        except AssertionError:
            state = ui.status() if ui.is_running() else "gone"
            # the job-control shell too: it is what writes the rc file (seen once: the UI gone, no rc in 90 s)
            raise AssertionError(f"tuner did not end after SIGTERM in the background: {state}; "
                                 f"{_thread_states(ui.pid)}; the shell: {_shell_state(tuner.proc.pid)}, "
                                 f"rc file {rc.read_text() if rc.exists() else 'absent'!r}") from None
        assert int(rc.read_text()) == exit_codes.INTERRUPTED
        assert _card_offset() == 0
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            ui.kill()

"""In-place progress lines fit the terminal (issue 24, item 3): a CLI bisect in an 80-column pty redraws its
progress line cut to the width, never wrapped (before: `trial 1 of ≤24 [######....]  32% +0 mV baseline  ETA 3s
bisect ~2m03s left` was 84+ columns, so each update became a new line).

The real `tuner` with the real (CPU) engine on a simulated card, its stderr a pty of 80x24; the test reads the
terminal until several progress redraws have arrived, then ends the bisect with SIGTERM (which resets the card).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

from tests.cli_helpers import REPO, run_tuner
from tuner.commands._output import StatusLine, display_width, fit, format_table

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
REDRAW = "\r\x1b[K"


def test_fit_cuts_by_terminal_columns_and_marks_the_cut():
    assert fit("short", 80) == "short"
    cut = fit("trial 1 of ≤24 [######....]  32% +0 mV baseline  ETA 3s  bisect ~2m03s left", 40)
    assert display_width(cut) == 40 and cut.endswith("…")
    assert display_width(fit("表" * 50, 79)) <= 79  # wide characters count two columns


def test_a_table_aligns_its_columns_by_terminal_columns():
    """format_table measured its cells with len(): a profile named in CJK (two columns a character) pushed the
    columns after it to the right of the other rows' (`tuner profile list`, `tuner unsafe list`)."""
    lines = format_table(("NAME", "SETTING", "TUNED"), [("显卡", "-40 mV", "yes"), ("card", "-30 mV", "no"),
                                                        ("e\u0301", "-5 mV", "no")]).splitlines()
    starts = [lines[0].index("SETTING")] + [line.index("-") for line in lines[1:]]
    at = {display_width(line[:i]) for line, i in zip(lines, starts, strict=True)}  # where each SETTING cell starts
    assert len(at) == 1, lines


def test_a_cli_bisect_in_an_80_column_terminal_never_draws_past_column_80():
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "--simulate", "--sim-vmin", "-52", "bisect", "--device",
                             "sim0", "--trial", "30s", "--confirm", "30s", "--yes"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})  # the pty decides
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 240
    try:
        while seen.decode(errors="replace").count(REDRAW) < 8 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
            if proc.poll() is not None:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        try:
            while select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 65536)
        except OSError:
            pass
        os.close(master)
    text = seen.decode(errors="replace")
    assert text.count(REDRAW) >= 8, text  # the progress line was drawn in place, several times
    # what follows each `\r ESC[K` up to the next \r or \n: a progress redraw, or a lasting line after a clear
    redraws = [re.split(r"[\r\n]", ANSI.sub("", chunk))[0] for chunk in text.split(REDRAW)[1:]]
    progress = [line for line in redraws if line.startswith("trial ") and "%" in line]
    assert len(progress) >= 7, redraws
    for line in progress:
        assert display_width(line) <= 80, line
    assert run_tuner("--simulate", "status", "--json").stdout.count('"current": 0') == 1


def test_the_status_line_follows_its_own_terminal_not_columns(monkeypatch):
    """The width comes from the stream's terminal (stderr may be a terminal while stdout is a pipe)."""

    class Narrow:
        written = ""

        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            return 99

        def write(self, text: str) -> None:
            self.written += text

        def flush(self) -> None:
            pass

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((30, 10)))
    stream = Narrow()
    StatusLine(stream).show("x" * 100)
    assert stream.written == REDRAW + "x" * 28 + "…"

"""The `tuner` command line: parse arguments, open the backend, dispatch to `tuner/commands/<name>.py`.

Each command module exposes `add_parser(subparsers)` (which sets `run=` as a default) and
`run(args, ctx) -> int`. This file turns TunerError into one line on stderr and its exit code.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import signal
import sys
from argparse import _SubParsersAction
from collections.abc import Sequence
from typing import Any

from tuner import __version__
from tuner.actions import other_tools
from tuner.actions.context import Context
from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S as KEEP_S
from tuner.backends.simulated_options import add_simulator_options
from tuner.core import exit_codes, signals
from tuner.core.argtypes import OneLineParser
from tuner.core.errors import TunerError, disk_full, is_disk_full

# In the order `tuner --help` lists them; each is tuner/commands/<name>.py (a missing one is an error).
COMMANDS = ("list", "status", "set", "reset", "stress", "bisect", "screen", "reference", "report", "profile", "apply",
            "service", "doctor", "unsafe")

DESCRIPTION = """\
Find the lowest stable GPU voltage setting with a real training workload, and keep it.

AMD cards are undervolted with a voltage offset (mV, sysfs pp_od_clk_voltage); NVIDIA cards with a locked
maximum clock plus a positive clock offset (MHz, NVML). Stability is judged by a small GPT training run that
checks every step for silent miscomputation, not only for crashes and NaNs.

Run without a command to open the terminal UI."""

EPILOG = f"""\
examples:
  tuner --simulate                      open the UI on a simulated GPU (no hardware touched)
  tuner list --json                     the GPUs found, as JSON
  tuner status --device 0000:03:00.0    one telemetry sample and the current setting
  tuner set --device 0000:03:00.0 --offset -50    apply, then keep or revert within {KEEP_S:.0f} s
  tuner bisect --device 0000:03:00.0 --save r9700 find the lowest stable setting, save a profile
  tuner apply r9700                     apply a saved profile (checks it is the same card)
  tuner doctor                          check drivers, permissions and kernel settings

{exit_codes.EXIT_CODE_HELP}

environment:
  XDG_CONFIG_HOME   profiles live in $XDG_CONFIG_HOME/tuner/profiles (default ~/.config)
  XDG_STATE_HOME    journals and the unsafe list in $XDG_STATE_HOME/tuner, simulated cards in
                    $XDG_STATE_HOME/tuner-simulated (default ~/.local/state)
  TUNER_SYSFS_ROOT  read and write sysfs under this root instead of / (fake trees, dry runs)
  TUNER_HELPER_SOCKET  the root helper to write through (default /run/tuner/helper.sock when it exists)
  TUNER_IGNORE_OTHER_TOOLS=1  as --ignore-other-tools (the UI's bisect too)
  TUNER_DTYPE       the stress engine's compute dtype (bfloat16, float16, float32)
  NO_COLOR          no colour in the UI"""


def _global_options(parser: argparse.ArgumentParser) -> None:
    """The simulator options, accepted before or after the command (`tuner --simulate list` or `tuner list
    --simulate`). The subcommands' parent parser suppresses every default (`argument_default=SUPPRESS`), so they
    never overwrite the main parser's (tuner.backends.simulated_options sets those)."""
    g = parser.add_argument_group("simulated GPU")
    g.add_argument("--simulate", action="store_true",
                   help="use simulated GPUs instead of real hardware (no root needed, nothing touched)")
    add_simulator_options(g)
    parser.add_argument("--ignore-other-tools", action="store_true",
                        help="bisect even while LACT's lactd, CoreCtrl's helper or nvidia-powerd may change the "
                        "same card (what was ignored is recorded in the profile; also TUNER_IGNORE_OTHER_TOOLS=1)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps prose paragraphs to the terminal, keeps indented lines (examples, tables) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        out = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") for line in lines) or paragraph.rstrip().endswith(":"):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(lines), width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(out)


class _SubparsersWithGlobals:
    """Wraps argparse's subparsers so every command also accepts the global options."""

    def __init__(self, subparsers: _SubParsersAction, parent: argparse.ArgumentParser) -> None:
        self._subparsers, self._parent = subparsers, parent

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs["epilog"] = "\n\n".join(filter(None, [kwargs.get("epilog"), exit_codes.EXIT_CODE_HELP]))
        kwargs["parents"] = [*kwargs.get("parents", []), self._parent]
        return self._subparsers.add_parser(name, **kwargs)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line (`tuner --help` lists every command), or with `only` the one command given: each
    command module imports what its command needs (the bisect the tuning job, the doctor its checks), and a command
    should not pay for the others' (`tuner status` starts in half the CPU time)."""
    parser = OneLineParser(
        prog="tuner",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    _global_options(parser)
    parent = OneLineParser(add_help=False, argument_default=argparse.SUPPRESS)
    _global_options(parent)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    wrapped = _SubparsersWithGlobals(subparsers, parent)
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"tuner.commands.{name}").add_parser(wrapped)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line. `tuner [global options]` opens the UI: it needs no command modules, so they are
    imported only when something besides the global options is given (the UI's first frame comes sooner)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    globals_only = OneLineParser(prog="tuner", add_help=False)
    _global_options(globals_only)
    args, rest = globals_only.parse_known_args(argv)
    if not rest:
        args.command = None
        return args
    return build_parser(only=rest[0] if rest[0] in COMMANDS else None).parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. Called with no arguments it is the `tuner` command itself and owns the
    process: a signal storm then ends with the documented code (`signals.install(ends_process=True)`)."""
    owns_process = argv is None
    signals.install(ends_process=owns_process)  # first: a signal during parsing ends through the same paths
    _closed_streams_to_devnull()
    if owns_process:
        _unencodable_escaped()
    ctx: Context | None = None
    code = exit_codes.OK
    ignore_before = os.environ.get(other_tools.IGNORE_ENV)
    try:
        args = _parse(argv)
        ctx = Context.from_args(args)
        if args.ignore_other_tools:
            os.environ[other_tools.IGNORE_ENV] = "1"  # read where a bisect is prepared (CLI or UI)
        if args.command is None:
            from tuner.app.tuner_app import run_app  # the UI is imported only when it is used

            code = run_app(ctx)
        else:
            code = args.run(args, ctx)
        if sys.stdout is not None:  # flushed now: a reader that left (`| head`) is seen here, not at interpreter exit
            sys.stdout.flush()
    except BaseException as e:  # noqa: BLE001 - every way out of a command gets its line and its code
        if owns_process:
            signals.ending()  # first: a signal now must not cut this handling short with a second exception
        code = _exit_code_for(e)
    finally:
        if owns_process:
            signals.ending()  # the code is chosen: a late signal cannot turn it into a traceback
        if ignore_before is None:
            os.environ.pop(other_tools.IGNORE_ENV, None)
        else:
            os.environ[other_tools.IGNORE_ENV] = ignore_before
        if ctx is not None:
            try:
                ctx.close()
            except BaseException as e:  # noqa: BLE001 - closing the backend never hides the command's own code
                if code == exit_codes.OK:
                    code = _exit_code_for(e)
    return code


def _closed_streams_to_devnull() -> None:
    """A stream the process was started without (`2>&-`, `>&-`, `<&-`) is None in Python: `print(file=None)` writes
    to stdout (an error line or a prompt would land in the document a script reads), a --json document written to
    a None stdout was a traceback where a plain print writes nothing, and so was a question asked of a None stdin.
    It is /dev/null instead: writes go nowhere, a read is at its end (no one can answer, so the answer is no)."""
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, mode))  # noqa: SIM115 - the process's own stream, open until exit


def _unencodable_escaped() -> None:
    """stdout is strict in most UTF-8 locales (en_US.UTF-8; C.UTF-8 is not): a file name with a non-UTF-8 byte (held
    as a lone surrogate) or a `°C` on an ASCII stdout was a UnicodeEncodeError after the command had done its work.
    Such characters are written as escapes instead, as Python's own stderr writes them."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def _say(line: str) -> None:
    """One line on stderr, if stderr is still there (`2>&-`, a closed pipe): never a second error."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _closed_pipe() -> int:
    """The reader of our output left: quiet, with the shell's SIGPIPE code; stdout goes to /dev/null so the
    interpreter's last flush cannot complain about the pipe either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return exit_codes.CLOSED_PIPE


def _exit_code_for(e: BaseException) -> int:
    """The one mapping from how a command ended to its line on stderr and its exit code."""
    if isinstance(e, SystemExit):  # argparse: usage errors and --help already printed their text
        return e.code if isinstance(e.code, int) else exit_codes.USAGE if e.code else exit_codes.OK
    if isinstance(e, TunerError):
        _say(f"tuner: error: {e.one_line()}")
        return e.exit_code
    if isinstance(e, BrokenPipeError) or (isinstance(e, signals.Terminated) and e.signum == signal.SIGPIPE):
        return _closed_pipe()
    if isinstance(e, KeyboardInterrupt | signals.Terminated):
        _say("tuner: interrupted")
        return exit_codes.INTERRUPTED
    if isinstance(e, OSError):
        if is_disk_full(e):
            _say(f"tuner: error: {disk_full(e.filename or 'a file').one_line()}")
            return exit_codes.DISK_FULL
        where = f"{e.filename}: " if e.filename else ""
        _say(f"tuner: error: {where}{e.strerror or e}; check the file's permissions and the file system "
             "(read-only? XDG_STATE_HOME?)")
        return exit_codes.PERMISSION
    raise e  # a bug: its traceback is the report

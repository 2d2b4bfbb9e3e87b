"""Entry point of `python -m tuner.engine`: protect stdout, parse arguments, run, exit with the verdict's code.

stdout carries only protocol lines: the real stdout file descriptor is kept for the protocol and fd 1 is
pointed at stderr, so stray prints (ours, torch's, a C library's) land in the log instead of the protocol.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time
import types  # io and types: loaded with the interpreter, for the annotations at no start-up cost

T0 = time.monotonic()
PARENT_AT_START = os.getppid()  # as early as possible: the parent may die while we start
ORPHAN_BACKSTOP_S = 10.0  # longer than the engine's own clean stop (runner.PARENT_GRACE_S plus a heartbeat)


def _protocol_stream() -> io.TextIOWrapper:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return proto


def main(argv: list[str] | None = None) -> int:
    from tuner.core import exit_codes
    from tuner.engine.events import EndEvent
    from tuner.engine.lifeline import PARENT_EXIT, exit_when_orphaned, parent_alive, set_parent_death_signal
    from tuner.engine.options import UsageProblem, parse_args
    from tuner.engine.protocol import Emitter

    set_parent_death_signal(signal.SIGTERM)  # a SIGKILLed tuner must not leave us running (re-checked below)
    # the engine stops cleanly on its own within PARENT_GRACE_S once its heartbeat watches; this ends it regardless
    exit_when_orphaned(PARENT_AT_START, grace_s=ORPHAN_BACKSTOP_S, code=exit_codes.INTERRUPTED)
    argv = sys.argv[1:] if argv is None else argv
    stream = _protocol_stream()
    emitter = Emitter(stream, t0=T0)
    try:
        opts = parse_args(argv)
    except UsageProblem as e:
        print(f"tuner.engine: error: {e}", file=sys.stderr, flush=True)
        emitter.emit(EndEvent.before_work(str(e), "usage", 2))
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    if opts.parent_pid is None:
        opts.parent_pid = PARENT_AT_START
    elif not parent_alive(opts.parent_pid):  # gone before we read PARENT_AT_START: the backstop watches init
        print("tuner.engine: the process that started the engine has exited: stopping", file=sys.stderr, flush=True)
        emitter.emit(EndEvent.before_work(f"interrupted by {PARENT_EXIT}", "interrupted", exit_codes.INTERRUPTED))
        return exit_codes.INTERRUPTED

    import importlib.util

    try:
        missing = importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):
        missing = True
    if missing:  # torch is the `engine` extra (issue 23): say which, exit 4
        why = "torch is not installed: the stress engine needs the engine extra"
        print(f"tuner.engine: error: {why}; pip install 'undervolt-tuner[engine]' with the torch build for your GPU "
              "(README, 'Installing torch')", file=sys.stderr, flush=True)
        emitter.emit(EndEvent.before_work(why, "usage", 4))
        return 4
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: harmless
    from tuner.engine import compiled

    # before anything imports torch: the allocator, cuBLAS and TunableOp read theirs at import or first use
    environment_notes = compiled.prepare_environment(compiled.cache_root(opts.cache_dir))
    from tuner.engine.runner import Engine

    engine = Engine(opts, emitter, environment_notes=environment_notes)

    def on_signal(signum: int, _frame: types.FrameType | None) -> None:
        gone = signum == signal.SIGTERM and not parent_alive(opts.parent_pid)  # the parent-death signal
        engine.stop_signal = PARENT_EXIT if gone else signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    code = engine.run()
    try:
        stream.flush()
    except OSError:
        pass
    return code

"""A stand-in for `python -m tuner.engine` that misbehaves on request, for the stress client's tests.

Run as `python fake_engine.py -u -m tuner.engine ...` (the client's argv with this script as the "python");
FAKE_ENGINE_MODE picks the behaviour. Fast: no torch. Every protocol event it writes carries every field the
engine's does (tests/engine/examples.py) and is checked against the protocol (tuner/engine/events.py), so the
client meets the real shapes; only the "garbage" mode writes what the engine never does, on purpose."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.engine.* below

from tests.engine.examples import EXAMPLES
from tuner.engine.events import BY_NAME, validate

T0 = time.monotonic()
MODE = os.environ.get("FAKE_ENGINE_MODE", "pass")


def emit(event: str, **fields) -> None:
    doc = {"event": event, "t": round(time.monotonic() - T0, 4), **EXAMPLES.get(event, {}), **fields}
    if event in BY_NAME:
        validate(doc)
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def start() -> None:
    print(f"fake engine argv: {json.dumps(sys.argv[1:])}", file=sys.stderr, flush=True)  # not a protocol field
    emit("start", mode="train", preset="tiny", device="cpu", device_name="Fake", pci_bus_id=None, dtype="fp32",
         params=1, tokens_per_step=512, batch_size=8, warmup_steps=1, repeatable=True, sensitivity="full")


def step(n: int, dt_ms: float = 10.0) -> None:
    time.sleep(dt_ms / 1e3)
    emit("step", step=n, loss=5.0 - n * 0.1, grad_norm=1.0, dt_ms=dt_ms, tok_s=51200.0, tflops=0.01)


def end(verdict="pass", kind=None, step_=None, steps=0, code=0, reason="completed", reference_step=None) -> None:
    emit("end", verdict=verdict, reason=reason, kind=kind, step=step_, reference_step=reference_step, steps=steps,
         duration_s=0.1,
         median_tok_s=51200.0, median_step_ms=10.0, bpb=3.5, eval_losses=[2.4, "NaN"], reference=None,
         recorded=None, sensitivity="full", setup_problems=[], warnings=0, canaries=0, exit_code=code)
    if MODE == "linger":  # the end goes out, then the process never exits (stuck tearing down a wedged GPU)
        forever()
    if MODE == "segv-after-end":  # the end goes out, then the process dies tearing down (a faulting GPU context)
        os.kill(os.getpid(), signal.SIGSEGV)
    if MODE == "hip-abort-after-end":  # HIP reports the fault at teardown's synchronize, after the end, and aborts
        print("Memory access fault by GPU node-1 (Agent handle: 0x55d) on address 0x7f. Reason: Page not present",
              file=sys.stderr, flush=True)
        os.abort()
    sys.exit(code)


def forever(beat: dict | None = None, interval: float = 0.1) -> None:
    while True:
        if beat is not None:
            emit("heartbeat", **beat)
        time.sleep(interval)


STATE = {"stop": False}


def main() -> None:
    if MODE == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif MODE == "term-graceful":
        signal.signal(signal.SIGTERM, lambda *_: STATE.update(stop=True))
    if MODE == "exit-before-start":
        print("ModuleNotFoundError: No module named 'torch'", file=sys.stderr)
        sys.exit(1)
    if MODE == "no-first-step":
        forever({"step": 0, "state": "setup", "progress": 0})
    start()
    if MODE in ("pass", "linger", "segv-after-end", "hip-abort-after-end"):
        for n in range(1, 6):
            step(n)
        end(steps=5)
    if MODE == "fail":
        step(1)
        emit("fault", kind="canary", step=2, reference_step=2, detail="canary differs")
        end("fail", "canary", 2, 2, 1, "canary differs", reference_step=2)
    if MODE == "busy":  # steady steps with a heartbeat after each (a stop from outside lands between them)
        for n in range(1, 201):
            step(n)
            emit("heartbeat", step=n, state="train", progress=n)
        end(steps=200)
    for n in range(1, 4):
        step(n)
    if MODE == "silent-hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        forever()
    if MODE == "stall":
        forever({"step": 3, "state": "train", "progress": 3})
    # "idle": between mixed-mode bursts; "collective": a data-parallel rank waiting for a slower peer (real engines
    # report that state). Either way 1.5 s of heartbeats without a step, then the run goes on.
    if MODE in ("idle", "collective"):
        t = time.monotonic()
        while time.monotonic() - t < 1.5:
            emit("heartbeat", step=3, state=MODE, progress=3)
            time.sleep(0.1)
        step(4)
        end(steps=4)
    if MODE == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if MODE == "hip-abort":
        print("Memory access fault by GPU node-1 (Agent handle: 0x55d) on address 0x7f. Reason: Page not present",
              file=sys.stderr, flush=True)
        os.abort()
    if MODE == "exit-no-end":
        sys.exit(1)
    if MODE == "bad-end":  # what the engine never writes: a pass that exits 1
        sys.stdout.write(json.dumps({"event": "end", "t": 1.0, **EXAMPLES["end"], "exit_code": 1}) + "\n")
        sys.exit(1)
    if MODE == "two-ends":  # what the engine never writes: its fail, then a pass
        step(1)
        emit("fault", kind="canary", step=2, reference_step=2, detail="canary differs")
        emit("end", verdict="fail", reason="canary differs", kind="canary", step=2, reference_step=2, steps=2,
             exit_code=1)
        end(steps=2)
    if MODE == "garbage":
        print("this is not json", flush=True)
        emit("mystery", value=1)
        print("[1, 2, 3]", flush=True)
        end(steps=3)
    if MODE in ("term-graceful", "ignore-term"):
        n = 3
        while not STATE["stop"]:
            n += 1
            step(n)
        end("error", "interrupted", None, n, 130, "interrupted by SIGTERM")
    raise SystemExit(f"unknown FAKE_ENGINE_MODE {MODE}")


if __name__ == "__main__":
    main()

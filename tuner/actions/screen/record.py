"""`tuner reference record`: a card's stock trajectory for one tier, proven repeatable, bundled for other machines.

Two stress runs of the stress action (`tuner.actions.stress`), at stock, under the card's writer lock:
1. the recording: the tier's load (`--tier`, 30 s quick), the engine writing its trajectory file;
2. the replay: the same steps in a second engine process, compared bit for bit with the recording. A reference
   that does not repeat on the card that recorded it would fail every card it is compared with (a whole fleet
   drained for one bad recording), so it is never bundled.
Then the bundle (`tuner.profiles.reference_bundle`): the trajectory as the engine wrote it, the card's must-match
fields and the may-differ origin, the held-out losses at the end of the recording (for the tolerance mode), sealed
with its hash, written atomically. Nothing on the card changes: a card off stock is refused (record at stock:
`tuner reset` first), never moved to stock behind the user's back.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tuner.actions.screen.attribution import Tier
from tuner.actions.stress import StressOutcome, StressRequest, StressSession
from tuner.backends.base import Backend
from tuner.core import exit_codes
from tuner.core.card_lock import CardLock
from tuner.core.errors import NoOffsetAllowed, TunerError, UsageError
from tuner.engine.reference import ReferenceProblem, load_reference
from tuner.profiles import reference_bundle as rb
from tuner.tuning.job import CardOutcome
from tuner.tuning.journal import reference_path


class RecordingFailed(TunerError):
    """The stock recording or its replay did not pass: no reference was written."""

    exit_code = exit_codes.TEST_FAILED


class RecordingStopped(TunerError):
    exit_code = exit_codes.INTERRUPTED


@dataclass(frozen=True)
class RecordRequest:
    device_id: str
    tier: Tier
    out: Path
    overwrite: bool = False
    preset: str | None = None  # None: the engine's default for the card (nanochat on GPUs, tiny simulated)
    seed: int = 0
    dtype: str | None = None


@dataclass(frozen=True)
class RecordOutcome:
    bundle: rb.Bundle
    path: Path
    size_bytes: int


def check_destination(out: Path, overwrite: bool, *, example: str = "stock.ref") -> None:
    """Before any run: a file we may write (not a directory, not an existing file without --overwrite, in a
    directory this user may write: os.access, the real uid). `tuner screen --out` asks it too (`example` names
    the kind of file in the hint)."""
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory", f"give a file name, e.g. --out {example}")
    if out.exists() and not overwrite:
        raise UsageError(f"--out {out} already exists", "pass --overwrite to replace it, or choose another name")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: no directory {out.parent}", "create it first, or choose another path")
    if not os.access(out.parent, os.W_OK | os.X_OK):  # found now, never after the two engine runs
        raise UsageError(f"--out {out}: the directory {out.parent} cannot be written by this user",
                         "choose a directory you can write, or fix its permissions")


def record_reference(backend: Backend, request: RecordRequest) -> RecordOutcome:
    """Record, replay, bundle, write. Raises UsageError (nothing run) or RecordingFailed (nothing written)."""
    out = Path(request.out)
    check_destination(out, request.overwrite)
    device = backend.device(request.device_id)
    with (tempfile.TemporaryDirectory(prefix="tuner-reference-", ignore_cleanup_errors=True) as work,
          CardLock(device.id, "tuner reference record")):
        try:
            knob = backend.knob(request.device_id)  # under the lock: no writer changes the card after this check
        except NoOffsetAllowed as e:  # AMD Overdrive off: the driver allows no offset, the card runs at stock
            knob = e.at_stock
        if knob.current != knob.stock:
            raise UsageError(f"{device.id} is at {knob.current:+d} {knob.unit}, not stock: a reference is recorded "
                             "at stock", f"`tuner reset --device {device.id}` first (then set your value again), "
                             "or record on a card at stock")
        trajectory_path = Path(work) / "trajectory.json"
        recorded = StressSession(backend, StressRequest(device.id, duration_s=request.tier.load_s,
                                                        record=trajectory_path, preset=request.preset,
                                                        seed=request.seed, dtype=request.dtype)).run()
        result = recorded.result
        if str(recorded.verdict) != "pass" or result is None or not trajectory_path.exists():
            raise _failed("the stock recording", recorded)
        try:
            trajectory = load_reference(trajectory_path)
        except ReferenceProblem as e:
            raise RecordingFailed(f"the stock recording wrote no usable trajectory: {e}") from None
        fp = trajectory.fingerprint
        replayed = StressSession(backend, StressRequest(
            device.id, steps=trajectory.steps, reference=trajectory_path, preset=fp.get("preset"),
            seed=int(fp.get("seed") or 0), dtype=fp.get("dtype"), compile=bool(fp.get("compile")))).run()
        end = replayed.result.end if replayed.result is not None else None
        compared = end.reference.compared_steps if end is not None and end.reference is not None else 0
        if str(replayed.verdict) != "pass" or compared < trajectory.steps:
            raise _failed("the replay of the stock recording in a second engine process", replayed,
                          "the card or platform does not repeat its own stock run bit for bit, so its "
                          "reference would fail every card compared with it")
        record_end = result.end
        losses = tuple(record_end.eval_losses) if record_end is not None else ()
        recording = rb.Recording(
            tier=request.tier.name, load_s=request.tier.load_s, steps=trajectory.steps,
            median_step_ms=record_end.median_step_ms if record_end is not None else None,
            repeatable=True, replayed_steps=compared, mode="train",
            eval_losses=losses if all(math.isfinite(x) for x in losses) else (),
            bpb=record_end.bpb if record_end is not None else None)
        bundle = rb.build_bundle(device=device, recording=recording, trajectory=trajectory)
        size = rb.write_bundle(bundle, out, overwrite=request.overwrite)
        return RecordOutcome(bundle, out, size)


def _failed(what: str, outcome: StressOutcome, why: str | None = None) -> TunerError:
    verdict = str(outcome.verdict)
    text = f"{what} did not pass ({verdict}: {outcome.reason}); no reference was written"
    if verdict == "stopped":
        return RecordingStopped(f"{what} was stopped; no reference was written")
    if verdict == "fail":
        return RecordingFailed(text, why or "record on a card that passes at stock")
    return UsageError(text, why or "see the engine's reason above; nothing was written")


def bundle_from_bisect(backend: Backend, device_id: str, trajectory_path: Path, *,
                       trial_s: float | None) -> tuple[rb.Bundle | None, str]:
    """The portable reference a bisect's profile carries: its stock baseline's trajectory (recorded at stock, one
    trial long, and replayed bit for bit in a second engine process before the search went on), bundled with this
    card's fingerprint. None, with why, when there is none to bundle (a GEMM-mode search, a baseline that was not
    proven repeatable, a file already gone). It has no held-out losses: the tolerance mode needs a reference from
    `tuner reference record`."""
    try:
        trajectory = load_reference(trajectory_path)
    except ReferenceProblem as e:
        return None, f"no stock trajectory to bundle ({e})"
    if trajectory.repeatable is not True:
        return None, "the stock baseline was not replayed bit for bit, so it is not bundled"
    steps = trajectory.steps
    recording = rb.Recording(tier="bisect baseline", load_s=float(trial_s or 1.0), steps=steps, repeatable=True,
                             replayed_steps=int(trajectory.replayed_steps or steps))
    return rb.build_bundle(device=backend.device(device_id), recording=recording, trajectory=trajectory), ""


@dataclass(frozen=True)
class BundledReference:
    """What a saved bisect profile carries beside it: the bundle's path and size, or why there is none."""

    path: Path | None
    size_bytes: int = 0
    sha256: str = ""
    steps: int = 0
    why: str = ""

    def to_dict(self) -> dict:
        if self.path is None:
            return {"path": None, "why": self.why}
        return {"path": str(self.path), "size_bytes": self.size_bytes, "sha256": self.sha256, "steps": self.steps}

    def text(self) -> str:
        """The tail of a "saved profile" line."""
        if self.path is None:
            return f" (no stock reference bundled: {self.why})"
        return f" with its stock reference {self.path} ({rb.kib(self.size_bytes)})"


def bundle_beside_profile(backend: Backend, device_id: str, outcome: CardOutcome,
                          profile_path: Path) -> BundledReference:
    """A saved bisect profile travels with its proof: the session's stock baseline (`bundle_from_bisect`), written
    beside the profile (`NAME.ref`) for `tuner screen` and `apply --verify` on other cards. One place for the CLI's
    `bisect --save` and the TUI's save. With none to bundle, a reference left at that place (a profile of that
    name deleted by hand) is removed: it is not this profile's."""
    if outcome.session is None:
        rb.remove_beside(profile_path)
        return BundledReference(None, why="no bisect session to take it from")
    bundle, why = bundle_from_bisect(backend, device_id, reference_path(device_id, outcome.session),
                                     trial_s=outcome.params.get("trial_s"))
    if bundle is None:
        rb.remove_beside(profile_path)
        return BundledReference(None, why=why)
    path, size = rb.write_beside(bundle, profile_path, overwrite=True)
    return BundledReference(path, size, bundle.sha256, bundle.steps)

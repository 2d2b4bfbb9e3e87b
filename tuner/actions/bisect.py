"""Start or resume a bisect of one card or several at once: every parameter check and the `--save` name check before
anything touches a card. `tuner bisect` and the Auto-bisect screen both call `prepare_bisect`, and save what it
found through `profile_from_outcome` / `rig_profile_from_outcome`."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from tuner.actions import other_tools
from tuner.backends.base import Backend
from tuner.core.errors import UsageError
from tuner.core.models import DeviceInfo
from tuner.profiles.schema import Profile
from tuner.tuning.events import BisectEvent
from tuner.tuning.job import (
    BisectEstimate,
    BisectJob,
    BisectOutcome,
    BisectParams,
    CardOutcome,
    estimate_search,
    lock_at_baseline_clock,
)


def bisect_estimate(backend: Backend, device_id: str, params: BisectParams) -> BisectEstimate:
    """The plan a new bisect of this card runs (trials at most, the confirmation, the time at most), by the rule
    the running bisect's ETA uses (tuner.tuning.job.estimate_left); UsageError for parameters it would refuse."""
    from tuner.tuning import journal

    knob = backend.knob(device_id)
    return estimate_search(knob, params, journal.unsafe_settings(device_id, backend, unit=knob.unit))


def consent_question(device: DeviceInfo) -> str | None:
    """What a person must say yes to before a bisect changes a real card's voltage (None: a simulated card).
    Every front end asks it (the CLI on its terminal or through --yes, the App in a dialog)."""
    if device.simulated:
        return None
    return (f"Bisect will undervolt {device.label} ({device.id}) step by step; a step too far can freeze the "
            "machine (the tuner recovers after a reboot). Continue?")


def after_save(name: str) -> str:
    """The next step once a bisect's result is saved as a profile (one card's or a rig's: `tuner apply` takes
    both), for the CLI; the UI says the same from where the user is (SAVED_NEXT_IN_UI)."""
    return f"next: tuner apply {shlex.quote(name)}"


SAVED_NEXT_IN_UI = "next: apply it from Profiles (4)"  # after_save's step, as the TUI offers it


def check_save_name(name: str | None) -> None:
    """A `--save` name that is valid and free, checked before hours of trials (`--save ""` is an error, not
    "do not save")."""
    if name is None:
        return
    from tuner.profiles import validate_name
    from tuner.profiles.store import profile_path

    validate_name(name, path="--save")
    if os.path.lexists(profile_path(name)):  # as the save itself sees it: a link, dangling or not, takes the name
        raise UsageError(f"a profile named {name!r} already exists", "pick another --save name or delete it")


def prepare_bisect(backend: Backend, device_ids: str | Sequence[str], params: BisectParams,
                   on_event: Callable[[BisectEvent], object] | None = None, *, save: str | None = None,
                   **job_options: Any) -> BisectJob:
    """Check everything a bisect of one card or several at once needs (every card's parameters, the --save name)
    and return its job (not started; `run()` blocks, `stop()` is thread-safe). `job_options` are BisectJob's
    injection points (tests: a fake engine, a fake trial runner)."""
    check_save_name(save)
    job = BisectJob(backend, device_ids, params, on_event, **job_options)  # refuses parameters that do not fit
    other_tools.refuse_before_bisect(backend, job.device_ids)  # issue 23: LACT, CoreCtrl, nvidia-powerd
    return job


def rig_devices(backend: Backend, spec: str | None) -> tuple[str, ...]:
    """The cards of a bisect: `all` (every card the backend sees), a comma list of ids (each known and named once,
    in card order), one id, or None: the only card there is."""
    known = [d.id for d in backend.devices()]
    if spec is None:
        if len(known) != 1:
            raise UsageError("several GPUs found" if known else "no GPU found",
                             "name one with --device ID, or every card with --device all (see `tuner list`)")
        return tuple(known)
    if spec.strip() == "all":
        if not known:
            raise UsageError("no GPU found", "check `tuner list`")
        return tuple(known)
    ids = [part.strip() for part in spec.split(",")]
    if any(not i for i in ids):
        raise UsageError(f"--device {spec!r} has an empty entry", "e.g. --device sim0,sim2 or --device all")
    for i in ids:
        backend.device(i)  # UnknownDevice (one line, exit 2) for an id that is not there
    if len(set(ids)) != len(ids):
        raise UsageError(f"--device {spec!r} names a card twice", "name each card once")
    return tuple(sorted(ids, key=known.index))


def collective_library(vendors: set[str]) -> str:
    """The collective library a data-parallel run over cards of these vendors uses: NCCL on NVIDIA, RCCL on ROCm
    (torch names it "nccl" too), gloo on the CPU engines of the simulated cards and on a mixed rig."""
    return "nccl" if vendors == {"nvidia"} else "rccl" if vendors == {"amd"} else "gloo"


def profile_from_outcome(backend: Backend, device_id: str, outcome: CardOutcome, name: str) -> Profile:
    """One card's profile from its finished bisect (`tuner bisect --save`, `--from-last`, the Auto-bisect screen's
    save). The knob is read as the trials ran it: on NVIDIA the lock clock is set again from the baseline first,
    since it is this process's choice (a `--from-last` process never locked the card; a knob read before the
    bisect holds the V/F table top)."""
    from tuner.profiles import build_profile

    if outcome.recommendation is None:
        raise UsageError(f"the bisect of {device_id} ended without a recommendation, so there is nothing to save",
                         "bisect the card again")
    lock_at_baseline_clock(backend, device_id, outcome.trials)
    return build_profile(name, backend.device(device_id), backend.knob(device_id), outcome.recommendation.setting,
                         tuning=card_tuning(device_id, outcome))


def card_tuning(device_id: str, outcome: CardOutcome) -> dict:
    """One card's `[tuning]` evidence, for a single-card profile and for each part of a rig profile alike: what its
    bisect measured, and the other tools it went on beside (--ignore-other-tools; None entries are left out)."""
    return {**(outcome.tuning() or {}), "other_tools": other_tools.ignored_for(device_id) or None}


def rig_profile_from_outcome(backend: Backend, outcome: BisectOutcome, name: str) -> Profile:
    """One rig profile from a finished rig bisect: a part per card that got a setting confirmed together, and the
    rig's evidence (confirmation time, attempts, collective library, workload). `tuner bisect --save` and the
    Auto-bisect screen's save both build it here, so a profile saved from the UI records what the CLI's does."""
    from tuner.profiles.build import RigPart, build_rig_profile

    if not outcome.settings:
        raise UsageError("no card got a setting confirmed together, so the rig profile would be empty",
                         "bisect the cards again, or save one card's own result from its journal")
    for device_id in outcome.settings:  # each knob as its trials ran it (NVIDIA: the lock), as profile_from_outcome
        lock_at_baseline_clock(backend, device_id, outcome.per_card[device_id].trials)
    parts = [RigPart(device=backend.device(d), knob=backend.knob(d), setting=v,
                     tuning=card_tuning(d, outcome.per_card[d])) for d, v in outcome.settings.items()]
    params = next((o.params for o in outcome.per_card.values() if o.params), {})
    # what the ranks reported (it wins over the vendor rule): this run's attempts, else the rig journal's records (a
    # session resumed after the passing attempt ran none of them here), else the vendor rule
    used = ([r.collective for r in outcome.rig_attempts if r.collective]
            or [a["collective"] for a in outcome.attempts if a.get("collective")])
    library = used[-1] if used else collective_library({backend.device(d).vendor for d in outcome.settings})
    rig = {"confirm_duration_s": params.get("confirm_s"), "attempts": len(outcome.attempts) or None,
           "backend": library, "mode": "mixed" if params.get("mode") != "gemm" else "gemm",
           "preset": params.get("preset"), "dtype": params.get("dtype")}
    return build_rig_profile(name, parts, rig={k: v for k, v in rig.items() if v is not None})

"""PLACEHOLDER (h-rig) so that tuner/tuning/rig.py imports and type-checks before h-dp's real module is merged.

The real `run_rig_trial` (RIG_API.md section 2, owner h-dp) replaces this whole file at the merge: take h-dp's
version. Only the types below are used by the rig driver; `run_rig_trial` here refuses to run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core.errors import UsageError
from tuner.tuning.engine_client import WatchdogPolicy
from tuner.tuning.events import TrialEvent, TrialResult


@dataclass(frozen=True)
class RigTrialParams:
    duration_s: float
    mode: str = "mixed"
    preset: str | None = None
    seed: int = 0
    dtype: str | None = None
    compile: bool | None = None
    watchdog: WatchdogPolicy | None = None
    record_paths: Mapping[str, Path] | None = None
    reference_paths: Mapping[str, Path] | None = None
    steps: int | None = None
    tolerance: bool = False
    phase: str = "rig-confirm"


@dataclass(frozen=True)
class RigTrialResult:
    results: Mapping[str, TrialResult]
    pinned: tuple[str, ...]
    machine_event: str | None
    stopped: bool = False


def run_rig_trial(backend: Backend, settings: Mapping[str, int], params: RigTrialParams,
                  on_event: Callable[[TrialEvent], None] | None, stop: threading.Event, *,
                  engine_factory: Callable | None = None,
                  kernel_watcher_factory: Callable | None = None) -> RigTrialResult:
    raise UsageError("the data-parallel rig trial is not in this build (placeholder awaiting the merge)",
                     "bisect one card at a time with --device ID")

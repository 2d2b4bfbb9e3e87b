"""What counts as evidence about a voltage: the rules that turn a measured trial into pass, fail or inconclusive.

- A pass needs at least `MIN_COMPARED_STEPS` steps compared with the reference after the engine's warm-up.
  Fewer is `inconclusive` (kind `too-short`) and runs again `RERUN_FACTOR` times longer, at most
  `MAX_SHORT_RERUNS` times; never a pass. Why 50: docs/bisect.md ("How long is long enough").
- An engine killed by a signal from outside (SIGKILL from the OOM killer or a user, SIGTERM, ...) with no GPU
  error and no kernel-log hit says nothing about the voltage: `inconclusive` (kind `engine-killed`), re-run on
  resume. Signals an engine raises on itself when the hardware miscomputes (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
  SIGABRT) stay failures.
- A trial that crashed or errored while the state directory's disk is full (the engine could not write its
  reference, ...) is `inconclusive` (kind `disk-full`), unless a GPU error, a hang or a kernel-log hit says
  otherwise; the job stops resumably with exit 7.
- A tuner that died in the same boot (kill -9, a full disk) is `inconclusive` (kind `tool-died`); only a machine
  reset, a hang or a GPU error puts a value on the unsafe list (the job and `journal` apply that).

Pure functions over `TrialResult`; no I/O.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from tuner.tuning.events import TrialResult

INCONCLUSIVE = "inconclusive"
TOO_SHORT, ENGINE_KILLED, TOOL_DIED, DISK_FULL = "too-short", "engine-killed", "tool-died", "disk-full"
DISK_FULL_BELOW_BYTES = 1 << 20  # less free space than this counts as full (fsync'd journals need a little)

MIN_COMPARED_STEPS = 50
RERUN_FACTOR = 4
MAX_SHORT_RERUNS = 3  # 1 s -> 4 s -> 16 s -> 64 s, then the bisect stops and says why

# Signals that come from outside the engine (the kernel's OOM killer sends SIGKILL; a user or a terminal the
# others). engine_client words an engine's death by signal as "the engine died of SIGNAME".
EXTERNAL_SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGUSR1", "SIGUSR2",
                    "SIGALRM", "SIGXCPU")
_DIED_OF = re.compile(r"died of (SIG[A-Z0-9]+)")


def compared_steps(steps: int | None, warmup_steps: int | None) -> int | None:
    """Steps compared after warm-up, or None when the engine did not report its step count."""
    if steps is None:
        return None
    return max(0, steps - (warmup_steps or 0))


def disk_full(path: Path) -> bool:
    """True when the file system holding `path` (the state directory) has (almost) no space left for us."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < DISK_FULL_BELOW_BYTES


def judge(result: TrialResult, *, baseline: bool, disk_is_full: bool = False) -> TrialResult:
    """The result as evidence: a short pass, an outside kill or a crash on a full disk becomes inconclusive;
    everything else is unchanged."""
    if (disk_is_full and result.verdict in ("fail", "error") and result.kind in ("crash", "setup", "no-result")
            and not result.kernel_log and not result.edge):
        return replace(result, verdict=INCONCLUSIVE, kind=DISK_FULL,
                       reason=f"the disk is full ({result.reason or result.kind}): not evidence about the voltage; "
                       "it runs again on resume")
    if result.verdict == "pass" and not baseline:
        n = compared_steps(result.steps, result.warmup_steps)
        if n is None or n < MIN_COMPARED_STEPS:
            got = "an unknown number of" if n is None else str(n)
            return replace(result, verdict=INCONCLUSIVE, kind=TOO_SHORT,
                           reason=f"only {got} steps compared after warm-up; a pass needs {MIN_COMPARED_STEPS}: "
                           "running it again, longer")
    if result.verdict == "fail" and result.kind == "crash" and not result.kernel_log:
        m = _DIED_OF.search(result.reason or "")
        if m and m.group(1) in EXTERNAL_SIGNALS:
            return replace(result, verdict=INCONCLUSIVE, kind=ENGINE_KILLED, edge=False,
                           reason=f"the engine was killed by {m.group(1)} from outside (no GPU error, no kernel "
                           "log entry): not evidence about the voltage; it runs again on resume")
    return result


def short_reruns(records: list[dict], setting: int, phase: str) -> int:
    """How many times this setting and phase already ran too short to count."""
    return sum(1 for r in records if r.get("setting") == setting and r.get("phase") == phase
               and r.get("verdict") == INCONCLUSIVE and r.get("kind") == TOO_SHORT)


def rerun_duration_s(base_s: float, reruns: int) -> float:
    """The duration of the next run after `reruns` too-short ones (capped at 7 days)."""
    return min(base_s * RERUN_FACTOR ** reruns, 7 * 24 * 3600.0)

"""The shapes of the safety files (session journal, rig journal, trial guard, unsafe-list line), declared once.

Each document is a msgspec Struct below; `tuner.core.documents.fit` holds a parsed file to it, strictly (an
integer is really an int, not "-40" or -40.0; a time is a finite number of seconds, not 1e308 or NaN). Keys a
newer tuner may add are let through. `problem` (and `check_journal`, for a session journal) returns None when the
document is valid, else one short phrase saying what is wrong and where (the caller names the file and the
remedy). Nothing here reads files; no textual, no torch.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from tuner.core.documents import Misfit, Words, fit, one_of
from tuner.core.durations import MAX_DURATION_S, MIN_DURATION_S
from tuner.core.models import Mode
from tuner.engine.options import DTYPES, PRESETS

# Session states
ACTIVE = "active"  # a process is (or was, if it died) running this session
INTERRUPTED = "interrupted"  # stopped cleanly (Ctrl-C, SIGTERM, stop()); resumable
FINISHED = "finished"  # ended with a recommendation or a final failure; nothing to resume
STATES = (ACTIVE, INTERRUPTED, FINISHED)
# Trial verdicts as the journal stores them ("stopped" trials are abandoned, never stored).
VERDICTS = ("pass", "fail", "error", "inconclusive")
VERSION = 1  # a card's journal and a rig's
RIG_PHASES = ("search", "baseline", "confirm", "done")
LAST_TIME_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z: any later "time" is damage, not a date
JSON = Words(integer="a whole number", number="a number", string="a string", boolean="true or false",
             date_time="a date-time", table="an object", array="a list")

Version = Annotated[int, Meta(ge=VERSION, le=VERSION, extra={"what": str(VERSION)})]
SessionId = Annotated[str, Meta(pattern=r"\A[A-Za-z0-9_.-]{1,80}\Z",
                                extra={"what": "a session id (letters, digits, '.', '_', '-')"})]
Time = Annotated[float, Meta(ge=0.0, le=LAST_TIME_S, extra={"what": "a time in seconds since 1970"})]
# pid_t is 32 bits (the kernel's PID_MAX_LIMIT is far below): a larger number names no process, and os.kill refuses it
Pid = Annotated[int, Meta(ge=1, le=2**31 - 1, extra={"what": "a whole number from 1 to 2147483647, a process id"})]
# when the writer of an open trial started (tuner.core.kernel_files.process_start_ticks: clock ticks since boot);
# absent from an older tuner's trial, which its pid alone names
StartTicks = Annotated[int, Meta(ge=0, extra={"what": "a whole number, 0 or more (clock ticks since boot)"})]
# a count the engine reported: a negative warm-up would count more steps compared than ran (evidence.compared_steps)
Steps = Annotated[int, Meta(ge=0, extra={"what": "a number of steps, 0 or more"})]
# a trial's measured length (trial.py: the engine's, else the wall clock's); the stock baseline's is the replay's
# length on resume (job._trial_params), so NaN, Infinity or -5 there is damage, not a length
Seconds = Annotated[float, Meta(ge=0.0, le=LAST_TIME_S, extra={"what": "a number of seconds, 0 or more"})]
CardSettings = Annotated[dict[str, int], Meta(extra={"what": "a map of card -> whole number", "whole": True})]
# a search's --trial, --confirm and --bound: the bounds every duration the command line and the form take has
# (tuner.core.durations); --resume runs with the stored one, so a NaN, 0 or -5 there is damage, not a trial length
Duration = Annotated[float, Meta(ge=MIN_DURATION_S, le=MAX_DURATION_S,
                                 extra={"what": "a duration of 1 to 604800 seconds (1 s to 7 days)"})]
# a recommendation's measurement (tok/s, W, tok/J, a gain in %), which `--from-last` saves into a profile: the writer
# stores a non-finite one as null (tuner.core.json_values), so Infinity or NaN here (Python's json reads both) is
# damage; let through, the profile refused it later without naming this file. Finite = within the float's range.
Measure = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max, extra={"what": "a finite number"})]


class _Doc(msgspec.Struct):
    """A JSON object of ours: unknown keys pass (a newer tuner may add some), the declared ones must fit."""


class OpenTrial(_Doc):
    """The trial a guard file (apply --verify) holds open."""

    setting: int
    phase: str
    boot_id: str | None = None
    pid: Pid | None = None
    pid_start_ticks: StartTicks | None = None
    started_at: Time | None = None
    device: str | None = None
    session: str | None = None
    unit: str | None = None  # a guard's: the unit and serial of the card it ran on (absent from an older one)
    serial: str | None = None


class SessionOpenTrial(OpenTrial, kw_only=True):
    """The trial a session journal holds open: it names its session."""

    session: str


class TrialRecord(_Doc):
    setting: int
    phase: str
    verdict: Annotated[str, one_of(VERDICTS)]
    kind: str | None = None
    steps: Steps | None = None
    warmup_steps: Steps | None = None
    duration_s: Seconds | None = None
    edge: bool = False
    # the stock baseline's is the lock a resumed NVIDIA bisect sets again (job.lock_at_baseline_clock; 0: none
    # measured): NaN or a negative one snapped to the lowest clock, Infinity to the table's top, which caps nothing;
    # the helper's wire takes no clock above 10000 MHz either (tuner.helper.schema.LockClock)
    median_core_clock_mhz: Annotated[float, Meta(ge=0.0, le=10_000.0,
                                                 extra={"what": "a clock of 0 to 10000 MHz"})] | None = None
    # the engine's (issue 26: the bound in hours); a step is no longer than a trial can be (a finite time: Infinity
    # sized the resumed trials with an infinite step)
    median_step_ms: Annotated[float, Meta(gt=0, le=MAX_DURATION_S * 1000.0)] | None = None


class Recommendation(_Doc):
    """A finished session's recommendation (what `tuner bisect --save NAME --from-last` saves). The keys without a
    default are the ones `events.Recommendation` has none for: the writer always writes them (`asdict`)."""

    setting: int
    margin: int
    unit: str
    confirmed: int | None
    lowest_pass: int | None
    first_failure: int | None
    edge: bool
    measured_at: int | None = None
    baseline_tok_s: Measure | None = None
    baseline_power_w: Measure | None = None
    baseline_tok_per_j: Measure | None = None
    tuned_tok_s: Measure | None = None
    tuned_power_w: Measure | None = None
    tuned_tok_per_j: Measure | None = None
    efficiency_gain_pct: Measure | None = None


class SearchParams(_Doc):
    """A session's search parameters (tuner.tuning.job.BisectParams.SEARCH_KEYS), which --resume runs with. A key
    an older tuner did not write may be missing (the command line's value stands in); one that is there must fit."""

    step: int | None = None
    resolution: int | None = None
    margin: int | None = None
    trial_s: Duration | msgspec.UnsetType = msgspec.UNSET
    confirm_s: Duration | msgspec.UnsetType = msgspec.UNSET
    floor: int | None = None
    # the choices the command line offers (tuner.actions.parameters) are these: the core's modes, the engine's own
    mode: Annotated[str, one_of(Mode)] | msgspec.UnsetType = msgspec.UNSET
    preset: Annotated[str, one_of(PRESETS)] | None = None
    dtype: Annotated[str, one_of(DTYPES)] | None = None
    seed: int | msgspec.UnsetType = msgspec.UNSET
    tolerance: bool | msgspec.UnsetType = msgspec.UNSET
    compile: bool | None = None
    bound_s: Duration | None = None


class Journal(_Doc):
    """A card's session journal."""

    version: Version
    session: SessionId
    device: str
    state: Annotated[str, one_of(STATES)]
    params: SearchParams
    trials: list[TrialRecord]
    knob: dict[str, Any] = {}
    pid: int | None = None
    boot_id: str | None = None
    reference: Annotated[str, Meta(extra={"what": "a path"})] | None = None
    created_at: Time | None = None
    updated_at: Time | None = None
    open_trial: SessionOpenTrial | None = None
    recommendation: Recommendation | None = None


class Guard(_Doc):
    open_trial: OpenTrial | None


class UnsafeEntry(_Doc):
    """One line of the unsafe list. `setting` must be a JSON integer: "-40" or -40.0 is damage, not a value."""

    setting: int
    kind: str
    unit: str | None = None
    device: str | None = None
    serial: str | None = None
    session: str | None = None
    boot_id: str | None = None
    reason: str | None = None
    edge: bool = False
    recorded_at: Time | None = None
    kernel_log: list[Any] | None = None


class RigOpenTrial(_Doc):
    """The rig trial open before it touches any card: every card's setting at once."""

    settings: CardSettings
    phase: str
    attempt: int | None = None
    boot_id: str | None = None
    pid: Pid | None = None
    pid_start_ticks: StartTicks | None = None
    started_at: Time | None = None


class RigJournal(_Doc):
    """A rig bisect's journal (`journal/rig+<dev>+....rig.json`, tuner.tuning.journal.Journal.create_rig)."""

    version: Version
    session: SessionId
    state: Annotated[str, one_of(STATES)]
    phase: Annotated[str, one_of(RIG_PHASES)]
    devices: Annotated[list[str], Meta(min_length=1, extra={"what": "a list of card ids", "whole": True})]
    params: SearchParams | msgspec.UnsetType = msgspec.UNSET
    candidates: CardSettings = {}
    stock: CardSettings = {}
    sessions: Annotated[dict[str, str], Meta(extra={"what": "a map of card -> session id", "whole": True})] = {}
    # each card's serial when the rig began (None: unknown); absent from an older tuner's rig journal, whose resume
    # takes the serial from each card's own journal of the rig's session instead (BisectJob._prepare)
    serials: Annotated[dict[str, str | None], Meta(extra={"what": "a map of card -> serial", "whole": True})] = {}
    attempts: list[Any] = []
    pid: int | None = None
    boot_id: str | None = None
    created_at: Time | None = None
    updated_at: Time | None = None
    never: Annotated[list[CardSettings], Meta(extra={"what": "a list of maps of card -> whole number",
                                                     "whole": True})] = []
    open_trial: RigOpenTrial | None = None


# --- the checks the journal modules call ---------------------------------------------------------------------
def _subject(path: tuple[str | int, ...]) -> str:
    """Where, as a person reads it: "'setting'", "open trial: 'setting'", "trial 3", "'candidates'"."""
    if len(path) >= 2 and path[0] == "trials" and isinstance(path[1], int):
        label, inner = f"trial {path[1] + 1}", path[2:]
    elif len(path) >= 2 and path[0] in ("open_trial", "recommendation"):
        label, inner = str(path[0]).replace("_", " "), path[1:]
    elif not path:
        return "it"
    else:
        label, inner = "", path
    quoted = repr(inner[0]) + "".join(f"[{k!r}]" for k in inner[1:]) if inner else ""
    return f"{label}: {quoted}" if label and quoted else label or quoted


def problem(doc: object, type_: type[_Doc]) -> str | None:
    """None when the document `doc` fits `type_` (a `Guard`, an `UnsafeEntry` line, a `RigJournal`), else the phrase."""
    if not isinstance(doc, dict):
        return "it is not a JSON object"
    try:
        fit(doc, type_, JSON)
    except Misfit as m:
        subject = _subject(m.path)
        if m.kind == "missing":
            return f"{subject} is missing"
        return f"{subject} is not {m.expected} (got {m.value!r:.40})"
    return None


def check_journal(doc: object, *, reference_name: str | None = None) -> str | None:
    """A session journal. `reference_name`: the file name the session's reference must have (in the state
    directory); a journal naming any other file is damaged (we only write what we own)."""
    found = problem(doc, Journal)
    if found or not isinstance(doc, dict):
        return found
    ref = doc.get("reference")
    if ref is not None and reference_name is not None and not ref.endswith("/" + reference_name):
        return f"'reference' names {ref!r:.80}, not the session's own file in the state directory"
    return None

"""The shapes of the safety files (session journal, trial guard, unsafe-list line), checked by hand.

A tiny explicit validator rather than a JSON-Schema library: three small documents, and the checks that matter
(an integer that is really an int, not "-40" or -40.0; a session id that is safe in a file name) read better as
code. Each `check_*` returns None when the document is valid, else one short phrase saying what is wrong (the
caller names the file and the remedy). Nothing here reads files; no textual, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable

SESSION_RE = re.compile(r"[A-Za-z0-9_.-]{1,80}")
STATES = ("active", "interrupted", "finished")
# Trial verdicts as the journal stores them ("stopped" trials are abandoned, never stored).
VERDICTS = ("pass", "fail", "error", "inconclusive")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, int | float)) and not isinstance(v, bool)


def _opt(v: object, check: Callable[[object], bool]) -> bool:
    return v is None or check(v)


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _field(doc: dict[str, object], key: str, check: Callable[[object], bool], what: str, *,
           required: bool) -> str | None:
    if key not in doc:
        return f"{key!r} is missing" if required else None
    if not check(doc[key]):
        return f"{key!r} is not {what} (got {doc[key]!r:.40})"
    return None


def _first(*problems: str | None) -> str | None:
    return next((p for p in problems if p), None)


def check_open_trial(trial: object, *, in_session: bool) -> str | None:
    """The `open_trial` of a journal (`in_session`) or of a guard file."""
    if trial is None:
        return None
    if not isinstance(trial, dict):
        return "'open_trial' is not an object"
    problem = _first(
        _field(trial, "setting", _is_int, "a whole number", required=True),
        _field(trial, "phase", _is_str, "a string", required=True),
        _field(trial, "boot_id", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(trial, "pid", lambda v: _opt(v, _is_int), "a whole number", required=False),
        _field(trial, "started_at", lambda v: _opt(v, _is_num), "a number", required=False),
        _field(trial, "device", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(trial, "session", _is_str, "a string", required=in_session),
    )
    return f"open trial: {problem}" if problem else None


def check_trial_record(record: object, index: int) -> str | None:
    if not isinstance(record, dict):
        return f"trial {index} is not an object"
    problem = _first(
        _field(record, "setting", _is_int, "a whole number", required=True),
        _field(record, "phase", _is_str, "a string", required=True),
        _field(record, "verdict", lambda v: v in VERDICTS, f"one of {', '.join(VERDICTS)}", required=True),
        _field(record, "kind", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(record, "steps", lambda v: _opt(v, _is_int), "a whole number", required=False),
        _field(record, "warmup_steps", lambda v: _opt(v, _is_int), "a whole number", required=False),
        _field(record, "duration_s", lambda v: _opt(v, _is_num), "a number", required=False),
        _field(record, "edge", lambda v: isinstance(v, bool), "true or false", required=False),
    )
    return f"trial {index}: {problem}" if problem else None


def check_journal(doc: object, *, reference_name: str | None = None) -> str | None:
    """A session journal. `reference_name`: the file name the session's reference must have (in the state
    directory); a journal naming any other file is damaged (we only write what we own)."""
    if not isinstance(doc, dict):
        return "it is not a JSON object"
    problem = _first(
        _field(doc, "version", lambda v: v == 1, "1", required=True),
        _field(doc, "session", lambda v: isinstance(v, str) and SESSION_RE.fullmatch(v) is not None,
               "a session id (letters, digits, '.', '_', '-')", required=True),
        _field(doc, "device", _is_str, "a string", required=True),
        _field(doc, "state", lambda v: v in STATES, f"one of {', '.join(STATES)}", required=True),
        _field(doc, "params", lambda v: isinstance(v, dict), "an object", required=True),
        _field(doc, "knob", lambda v: isinstance(v, dict), "an object", required=False),
        _field(doc, "trials", lambda v: isinstance(v, list), "a list", required=True),
        _field(doc, "pid", lambda v: _opt(v, _is_int), "a whole number", required=False),
        _field(doc, "boot_id", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(doc, "reference", lambda v: _opt(v, _is_str), "a path", required=False),
        check_open_trial(doc.get("open_trial"), in_session=True),
        check_recommendation(doc.get("recommendation")),
    )
    if problem:
        return problem
    for i, record in enumerate(doc["trials"], start=1):
        problem = check_trial_record(record, i)
        if problem:
            return problem
    ref = doc.get("reference")
    if ref is not None and reference_name is not None and not ref.endswith("/" + reference_name):
        return f"'reference' names {ref!r:.80}, not the session's own file in the state directory"
    return None


def check_recommendation(rec: object) -> str | None:
    """A finished session's recommendation (what `tuner bisect --save NAME --from-last` saves)."""
    if rec is None:
        return None
    if not isinstance(rec, dict):
        return "'recommendation' is not an object"
    ints = ("setting", "margin")
    opt_ints = ("confirmed", "lowest_pass", "first_failure", "measured_at")
    nums = ("baseline_tok_s", "baseline_power_w", "baseline_tok_per_j", "tuned_tok_s", "tuned_power_w",
            "tuned_tok_per_j", "efficiency_gain_pct")
    problem = _first(
        *(_field(rec, k, _is_int, "a whole number", required=True) for k in ints),
        *(_field(rec, k, lambda v: _opt(v, _is_int), "a whole number", required=False) for k in opt_ints),
        *(_field(rec, k, lambda v: _opt(v, _is_num), "a number", required=False) for k in nums),
        _field(rec, "unit", _is_str, "a string", required=True),
        _field(rec, "edge", lambda v: isinstance(v, bool), "true or false", required=False),
    )
    return f"recommendation: {problem}" if problem else None


def check_guard(doc: object) -> str | None:
    if not isinstance(doc, dict):
        return "it is not a JSON object"
    if "open_trial" not in doc:
        return "'open_trial' is missing"
    return check_open_trial(doc["open_trial"], in_session=False)


def check_unsafe_entry(entry: object) -> str | None:
    """One line of the unsafe list. `setting` must be a JSON integer: "-40" or -40.0 is damage, not a value."""
    if not isinstance(entry, dict):
        return "it is not a JSON object"
    return _first(
        _field(entry, "setting", _is_int, "a whole number", required=True),
        _field(entry, "kind", _is_str, "a string", required=True),
        _field(entry, "unit", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(entry, "device", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(entry, "reason", lambda v: _opt(v, _is_str), "a string", required=False),
        _field(entry, "edge", lambda v: isinstance(v, bool), "true or false", required=False),
        _field(entry, "recorded_at", lambda v: _opt(v, _is_num), "a number", required=False),
        _field(entry, "kernel_log", lambda v: _opt(v, lambda x: isinstance(x, list)), "a list", required=False),
    )

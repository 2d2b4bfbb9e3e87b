"""A bisect's trials as a report file: CSV (one row per trial, for a spreadsheet) or JSON (the session and its
trials), chosen by the file's suffix. One place for the UI's export and `tuner report`.

Plain Python: the trials are the journal's records (tuner.tuning.events.TrialResult.to_record), which is also
what the UI's rows are made of.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from tuner.core import json_values
from tuner.core.atomic import write_atomic
from tuner.core.errors import StateError, UsageError
from tuner.tuning import journal

# the columns a person reads first; any other figure a record has follows, in its own name's order
COLUMNS = ("setting", "unit", "phase", "verdict", "kind", "reason", "duration_s", "tok_s", "power_w", "tok_per_j",
           "efficiency_vs_stock", "max_temp_c", "voltage_mv", "fault_step", "started_at", "ended_at")
FORMATS = (".csv", ".json")


def finished_trials(records: Iterable[Mapping]) -> list[dict]:
    """The trials that have a result (a running row is not one)."""
    return [dict(r) for r in records if r.get("verdict") not in (None, "running")]


def _cell(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return ""  # as a missing figure: a spreadsheet reads "nan" as text
    if isinstance(value, list | tuple):
        return "; ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json_values.dumps(value, sort_keys=True)
    return "" if value is None else value


def to_csv(trials: list[dict], *, simulated: bool = False) -> str:
    """One row per trial. A simulated card's rows each say SIMULATED in a first `simulated` column: a CSV has no
    note beside its rows (the JSON's), and a row copied out of it must not pass for a real card's measurement."""
    extra = sorted({k for t in trials for k in t} - set(COLUMNS))
    columns = [c for c in COLUMNS if any(c in t for t in trials)] + extra
    label = ["simulated"] if simulated else []
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(label + columns)
    for t in trials:
        writer.writerow(["SIMULATED"] * len(label) + [_cell(t.get(c)) for c in columns])
    return out.getvalue()


def to_json(trials: list[dict], *, device_id: str, session: str | None, simulated: bool,
            recommendation: Mapping | None = None) -> str:
    doc = {"device": device_id, "session": session, "simulated": simulated, "trials": trials,
           "recommendation": recommendation}
    if simulated:
        doc["note"] = "SIMULATED card: power is the simulator's and tok/s the CPU engine's; not a real measurement"
    return json_values.dumps(doc, indent=2, sort_keys=False) + "\n"  # NaN is not JSON: null


def write_report(path: Path, trials: Iterable[Mapping], *, device_id: str, session: str | None,
                 simulated: bool, recommendation: Mapping | None = None, overwrite: bool = False) -> Path:
    """Write the report; the format follows the suffix (.csv or .json). Nothing is written on bad input."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"{path.name}: a report is .csv or .json, got {suffix or 'no suffix'!r}",
                         "name the file e.g. bisect.csv or bisect.json")
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists; nothing was written", "choose another file name")
    rows = finished_trials(trials)
    text = to_csv(rows, simulated=simulated) if suffix == ".csv" else to_json(
        rows, device_id=device_id, session=session, simulated=simulated, recommendation=recommendation)
    try:
        write_atomic(path, text.encode())
    except OSError as e:
        raise StateError(f"cannot write {path}: {e.strerror or e}", "choose a directory you can write to") from None
    return path


def last_session(device_id: str) -> dict:
    """The device's latest bisect session as the journal has it (finished or not)."""
    doc = journal.load(device_id)
    if doc is None:
        raise UsageError(f"no bisect session recorded for {device_id}", f"run `tuner bisect --device {device_id}`")
    return doc

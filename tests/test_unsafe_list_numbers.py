"""`tuner unsafe list` over an unsafe line holding 1e308, NaN or Infinity prints one line per entry or one error
line, never a traceback (issue 28, item 7); its --json output is strict JSON whatever the line held.

Whether such a line is valid is the schema's call (tuner.tuning.journal_schema); this only holds the CLI to
"never a traceback, never non-JSON" for either answer.
"""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_tuner
from tuner.tuning import journal


def _strict(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("recorded_at", ["1e308", "NaN", "Infinity", "-Infinity", "1e400"])
def test_an_unsafe_line_with_a_number_no_clock_can_show(recorded_at):
    path = journal.unsafe_path("sim0")
    path.parent.mkdir(parents=True)
    good = {"device": "sim0", "serial": None, "setting": -60, "unit": "mV", "kind": "hang", "reason": "froze",
            "edge": True, "session": None, "boot_id": None, "recorded_at": 1_700_000_000.0, "kernel_log": []}
    odd = json.dumps({**good, "setting": -65}).replace("1700000000.0", recorded_at)
    path.write_text(json.dumps(good) + "\n" + odd + "\n")

    table = run_tuner("--simulate", "unsafe", "list")
    assert "Traceback" not in table.stderr, table.stderr
    if table.returncode == 0:  # the schema took it: one line per entry under the header
        lines = table.stdout.strip().splitlines()
        assert len(lines) == 3 and "-60 mV" in lines[1] and "-65 mV" in lines[2], table.stdout
        assert lines[2].split()[5] == "-"  # no date for a time no clock can show
    else:
        assert table.returncode == 2 and table.stderr.count("\n") == 1 and "line 2" in table.stderr, table.stderr

    as_json = run_tuner("--simulate", "unsafe", "list", "--json")
    assert "Traceback" not in as_json.stderr, as_json.stderr
    if as_json.returncode == 0:
        entries = _strict(as_json.stdout)["unsafe"][0]["entries"]
        assert [e["setting"] for e in entries] == [-60, -65]
        assert entries[1]["recorded_at"] in (None, 1e308)
    else:
        assert as_json.returncode == 2 and as_json.stderr.count("\n") == 1, as_json.stderr


def test_unsafe_clear_names_its_values_in_numeric_order():
    """`tuner unsafe clear` sorted the values it names as strings: '-10 mV' came before '-100 mV' and '-5 mV' before
    '-50 mV' (a space sorts before a digit), so the list it asks about read out of order. In numeric order now."""
    path = journal.unsafe_path("sim0")
    path.parent.mkdir(parents=True)
    entry = {"device": "sim0", "serial": None, "unit": "mV", "kind": "hang", "reason": "froze", "edge": False,
             "session": None, "boot_id": None, "recorded_at": 1_700_000_000.0, "kernel_log": []}
    path.write_text("".join(json.dumps({**entry, "setting": s}) + "\n" for s in (-10, -100, -5, -50)))
    proc = run_tuner("--simulate", "unsafe", "clear", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "removed -100 mV, -50 mV, -10 mV, -5 mV from sim0's unsafe list", proc.stdout

"""`tuner report x.json` writes strict JSON (issue 28, item 10): a trial figure that is NaN or Infinity (a tok/J
over a zero power, an efficiency over a missing baseline) is null, never the `NaN` no JSON parser reads; in the
CSV it is an empty cell, as any missing figure."""

from __future__ import annotations

import csv
import json

from tuner.actions.report import write_report

TRIALS = [{"setting": -30, "unit": "mV", "phase": "coarse", "verdict": "pass", "tok_s": 1200.0,
           "tok_per_j": float("nan"), "efficiency_vs_stock": float("inf"), "sensitivity": {"x": float("-inf")}}]


def _strict(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_figures_are_null_in_json_and_empty_in_csv(tmp_path):
    doc = _strict(write_report(tmp_path / "x.json", TRIALS, device_id="sim0", session="s", simulated=True,
                               recommendation={"efficiency_gain_pct": float("nan")}).read_text())
    trial = doc["trials"][0]
    assert (trial["tok_per_j"], trial["efficiency_vs_stock"], trial["sensitivity"]) == (None, None, {"x": None})
    assert doc["recommendation"] == {"efficiency_gain_pct": None} and trial["tok_s"] == 1200.0
    rows = list(csv.DictReader(write_report(tmp_path / "x.csv", TRIALS, device_id="sim0", session="s",
                                            simulated=True).open()))
    assert (rows[0]["tok_per_j"], rows[0]["efficiency_vs_stock"], rows[0]["tok_s"]) == ("", "", "1200.0")
    assert json.loads(rows[0]["sensitivity"]) == {"x": None}


def test_a_simulated_cards_csv_says_so_on_every_row(tmp_path):
    """A simulated card is labelled SIMULATED wherever it is shown: the JSON report carries `simulated` and a note,
    but the CSV of the same trials (power from the simulator, tok/s from the CPU engine) looked like a real card's.
    A real card's CSV is unchanged."""
    rows = list(csv.DictReader(write_report(tmp_path / "sim.csv", TRIALS * 2, device_id="sim0", session="s",
                                            simulated=True).open()))
    assert [r.get("simulated") for r in rows] == ["SIMULATED", "SIMULATED"], rows
    real = write_report(tmp_path / "real.csv", TRIALS, device_id="0000:03:00.0", session="s", simulated=False)
    assert "simulated" not in real.read_text().lower()

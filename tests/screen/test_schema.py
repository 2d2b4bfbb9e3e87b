"""The published verdict schema is the one the Structs generate, and a verdict the Structs encode validates against
the file with an independent validator (jsonschema); a document that breaks it does not."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tuner.actions.screen import verdict as v

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / v.SCHEMA_FILE).read_text())


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def test_the_file_is_the_generated_schema():
    assert (REPO / v.SCHEMA_FILE).read_text() == v.schema_text(), (
        "regenerate: python -c 'from tuner.actions.screen import verdict as v; "
        "open(v.SCHEMA_FILE, \"w\").write(v.schema_text())'")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def sample(verdict: str = "pass") -> v.ScreenReport:
    card = v.CardVerdict(
        host="node1", card=v.CardIdentity(id="sim0", vendor="simulated", model="Sim", pci_id="0000:0000",
                                          pci_slot=None, serial="S", vbios="SIM.000.000", driver_version="simulated",
                                          simulated=True),
        setting=v.SettingDoc(kind="voltage_offset", unit="mV", value=0, stock=0, at_stock=True, source="current",
                             left_at=0),
        tier=v.TierDoc(name="quick", dcgm_level=1, load_s=30.0), mode="bitwise", verdict=verdict,
        severity=v.SEVERITY[verdict], action="ok", reason="r", attribution=None, incomparable=[],
        evidence=v.EvidenceDoc(steps_compared=10, reference_steps=10, segments=1, differences=0,
                               first_difference=None, detectors={"reference": "ok"}, detectors_fired=[],
                               kernel_log=[], counters=v.CountersDoc(available=False, source=None, why="none",
                                                                     counters=[]),
                               runs=[], tolerance=None, checks_off=[]),
        bound=None, exit_code=v.VERDICT_EXIT[verdict])
    return v.ScreenReport(schema=v.SCHEMA_ID, tuner_version="0.1.0", host="node1", created="2026-12-02T00:00:00Z",
                          tier=card.tier, reference=v.ReferenceDoc(path="A.ref", bundled_with=None, sha256="0" * 64,
                                                                   tuner_version="0.1.0", created="x", preset="tiny",
                                                                   steps=10, tier="quick", load_s=30.0, card={},
                                                                   origin={}),
                          verdicts=[card], exit_code=card.exit_code, summary="1 card: 1 pass")


@pytest.mark.parametrize("verdict", ["pass", "fail", "retest", "incomparable"])
def test_encoded_verdicts_validate(verdict):
    validate(json.loads(v.encode(sample(verdict))))


@pytest.mark.parametrize("break_it", [
    lambda d: d["verdicts"][0].update(verdict="ok"),
    lambda d: d["verdicts"][0].pop("action"),
    lambda d: d["verdicts"][0]["evidence"]["counters"].update(available="yes"),
    lambda d: d.update(extra=1),
    lambda d: d["verdicts"][0].update(action="reboot"),
])
def test_broken_documents_do_not(break_it):
    doc = json.loads(v.encode(sample()))
    break_it(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_non_finite_held_out_losses_still_give_a_valid_document():
    """A card whose held-out losses are NaN or infinite (a typical miscomputation) fails the tolerance mode; its
    document must still validate (JSON has no NaN or infinity: msgspec writes them as null, which a number field
    refuses), and the comparison's text says what happened rather than '+inf ± nan'."""
    import msgspec

    from tuner.actions.screen.card import _tolerance_doc
    from tuner.actions.screen.tolerance import paired

    comparison = paired([1.0, 2.0, 3.0], [float("nan"), 2.0, float("inf")])
    assert comparison.verdict == "fail"
    assert "nan" not in comparison.text() and "inf" not in comparison.text() and "not finite" in comparison.text()
    report = sample("fail")
    card = report.verdicts[0]
    evidence = msgspec.structs.replace(card.evidence, tolerance=_tolerance_doc(comparison))
    card = msgspec.structs.replace(card, mode="tolerance", evidence=evidence)
    validate(json.loads(v.encode(msgspec.structs.replace(report, verdicts=[card]))))

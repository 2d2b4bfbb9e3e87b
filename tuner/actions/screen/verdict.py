"""The screen's verdict, declared once: msgspec Structs that `tuner screen --json` encodes, and from which the
published JSON Schema (`docs/schemas/screen-verdict.v1.json`) is generated (`json_schema()`; a test keeps the file
equal to it, and validates every emitted document against the file with the `jsonschema` library).

Versioned: `schema` is "tuner-screen-verdict/1". A change that removes or retypes a field is version 2 (a new
file beside this one); adding a field is not. Every field is always present (null where it does not apply) so a
scheduler's script can read it without checking for a key. Counters a card cannot read are null with the reason,
never 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from tuner.core import exit_codes

SCHEMA_ID: Literal["tuner-screen-verdict/1"] = "tuner-screen-verdict/1"
SCHEMA_FILE = "docs/schemas/screen-verdict.v1.json"

VerdictName = Literal["pass", "fail", "retest", "incomparable"]
Severity = Literal["ok", "warning", "critical"]
Action = Literal["ok", "retest", "drain", "raise voltage", "reset to stock"]
Attribution = Literal["transient", "persistent at this setting", "persistent at stock", "not attributed"]
TierName = Literal["quick", "standard", "long", "custom"]
RunPurpose = Literal["screen", "repeat", "stock"]

# exit code per verdict; a screen of several cards exits with the worst (EXIT_ORDER: worst first)
VERDICT_EXIT = {"pass": exit_codes.OK, "fail": exit_codes.TEST_FAILED, "retest": exit_codes.SCREEN_RETEST,
                "incomparable": exit_codes.SCREEN_INCOMPARABLE}
EXIT_ORDER = ("fail", "incomparable", "retest", "pass")
SEVERITY: dict[VerdictName, Severity] = {"pass": "ok", "retest": "warning", "incomparable": "warning",
                                        "fail": "critical"}


def _d(text: str) -> Meta:
    return Meta(description=text)


class _Doc(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CardIdentity(_Doc, frozen=True, kw_only=True):
    """The card screened, as its driver names it."""

    id: Annotated[str, _d("the tuner's device id (`tuner list`): PCI slot, or simN for a simulated card")]
    vendor: Annotated[str, _d("amd, nvidia or simulated")]
    model: str
    pci_id: Annotated[str | None, _d("vendor:device")]
    pci_slot: str | None
    serial: Annotated[str | None, _d("serial number or NVIDIA UUID")]
    vbios: str | None
    driver_version: str | None
    simulated: Annotated[bool, _d("a simulated card: no hardware was screened")]


class SettingDoc(_Doc, frozen=True, kw_only=True):
    """The setting the card was screened at, where it came from, and where the card was left."""

    kind: Annotated[str, _d("voltage_offset (AMD, mV) or clock_offset (NVIDIA, MHz)")]
    unit: str
    value: Annotated[int, _d("the setting screened")]
    stock: int
    at_stock: bool
    source: Annotated[str, _d("`current` (the card's own setting), `current (overdrive off)` (the card's own "
                              "setting where the driver allows no offset, AMD Overdrive off: stock), or `profile "
                              "NAME` (--profile: the profile's setting, applied for the screen only)")]
    left_at: Annotated[int, _d("the card's setting after the screen, read back: its own setting (a profile's is "
                               "never left on the card; a driver reset leaves it at stock)")]


class TierDoc(_Doc, frozen=True, kw_only=True):
    name: TierName
    dcgm_level: Annotated[int | None, _d("the DCGM diagnostic level of about the same length (dcgmi diag -r)")]
    load_s: Annotated[float, _d("seconds of load per run")]


class DifferenceDoc(_Doc, frozen=True, kw_only=True):
    """A must-match field that differs from the reference's."""

    field: Annotated[str, _d("tuner_version, card.* or engine.* (docs/screen.md lists them)")]
    reference: Any
    here: Any


class FirstDifference(_Doc, frozen=True, kw_only=True):
    step: Annotated[int | None, _d("the step of this run where a detector fired (null: not tied to a step)")]
    reference_step: Annotated[int | None, _d("the reference step it was compared with")]
    figure: Annotated[str | None, _d("loss, grad_norm, grads or state: the figure that differed")]
    kind: Annotated[str, _d("mismatch, canary, gemm, nonfinite, device-error, hang, crash, kernel-log, ecc, ...")]
    detail: str


class RunDoc(_Doc, frozen=True, kw_only=True):
    """One engine run of this screen."""

    purpose: Annotated[RunPurpose, _d(
        "screen: the run at the card's setting; repeat: the same steps again at that setting; stock: the same "
        "steps at stock (the card put back afterwards)")]
    setting: int
    verdict: Annotated[str, _d("the run's own outcome: pass, fail, error or stopped")]
    kind: str | None
    steps: int
    compared_steps: int
    step: int | None
    duration_s: float | None
    reason: str


class CounterDoc(_Doc, frozen=True, kw_only=True):
    name: Annotated[str, _d("e.g. ecc_uncorrected_volatile, remapped_rows_pending, ras_umc_ue")]
    before: int | None
    after: int | None
    change: Annotated[int | None, _d("after - before; null when either could not be read")]


class CountersDoc(_Doc, frozen=True, kw_only=True):
    """Hardware error counters read before and after (read-only): NVML ECC and row remapping, amdgpu
    ras/*_err_count. `available` false with `why` where the card or backend has none: never a silent 0."""

    available: bool
    source: str | None
    why: str | None
    counters: list[CounterDoc]


class ToleranceDoc(_Doc, frozen=True, kw_only=True):
    """The labelled tolerance mode: the held-out losses of the same fixed windows after the same batches in the
    same order, paired with the reference's."""

    windows: int
    mean_difference_nats: Annotated[float, _d("mean of (this card - reference) per window, nats")]
    ci95_nats: Annotated[list[float], _d("95 % confidence interval of the mean difference (t distribution)")]
    margin_nats: Annotated[float, _d("pass when the whole interval lies within +/- this margin")]


class EvidenceDoc(_Doc, frozen=True, kw_only=True):
    steps_compared: Annotated[int, _d("steps compared with the reference in the screen run (bitwise mode)")]
    reference_steps: int
    segments: Annotated[int, _d("passes over the reference (a longer screen restarts it from the initial weights)")]
    differences: Annotated[int, _d("differing steps found (runs stop at the first)")]
    first_difference: FirstDifference | None
    detectors: Annotated[dict[str, str], _d("each detector's state: ok, fired, n/a (why) or off (why)")]
    detectors_fired: list[str]
    kernel_log: Annotated[list[str], _d("kernel-log lines about this card during the screen")]
    counters: CountersDoc
    runs: list[RunDoc]
    tolerance: ToleranceDoc | None
    checks_off: Annotated[list[str], _d("every check that did not run at full strength, with why")]


class BoundDoc(_Doc, frozen=True, kw_only=True):
    """What zero differences in `steps` compared steps support (tuner/tuning/bound.py): the per-step fault rate
    is below `rate_per_step` at 95 %; with the step time, at most one fault per `duration_s` of this load."""

    confidence: float
    steps: int
    faults: int
    rate_per_step: float
    steps_per_fault: float
    duration_s: float | None
    step_s: float | None
    text: str


class CardVerdict(_Doc, frozen=True, kw_only=True):
    """One card's verdict."""

    host: str
    card: CardIdentity
    setting: SettingDoc
    tier: TierDoc
    mode: Annotated[Literal["bitwise", "tolerance"], _d(
        "bitwise: every step compared bit for bit; tolerance: held-out losses compared (reduced sensitivity)")]
    verdict: VerdictName
    severity: Severity
    action: Annotated[Action, _d("what a scheduler should do with this card")]
    reason: str
    attribution: Annotated[Attribution | None, _d("on a fault: did it repeat, and does stock explain it")]
    incomparable: Annotated[list[DifferenceDoc], _d("the must-match fields that differ (verdict incomparable)")]
    evidence: EvidenceDoc
    bound: Annotated[BoundDoc | None, _d("a pass's bound (null otherwise)")]
    exit_code: int


class ReferenceDoc(_Doc, frozen=True, kw_only=True):
    path: str
    bundled_with: Annotated[str | None, _d("the profile whose bundled reference (NAME.ref beside it) was used "
                                           "because --reference was not given; null: --reference FILE")]
    sha256: str
    tuner_version: str
    created: str
    preset: str | None
    steps: int
    tier: str
    load_s: float
    card: dict[str, Any]
    origin: dict[str, Any]


class ScreenReport(_Doc, frozen=True, kw_only=True):
    """`tuner screen --json`: one document, one verdict per card."""

    schema: Literal["tuner-screen-verdict/1"]
    tuner_version: str
    host: str
    created: Annotated[str, _d("UTC, ISO 8601")]
    tier: TierDoc
    reference: ReferenceDoc
    verdicts: list[CardVerdict]
    exit_code: Annotated[int, _d("0 only when every card passed; else the worst: fail 1, incomparable 11, retest 10 "
                                 "(interrupted 130)")]
    summary: str


def overall_exit(verdicts: Sequence[str]) -> int:
    """The worst verdict's exit code (no cards: a usage error, never a pass)."""
    if not verdicts:
        return exit_codes.USAGE
    worst = min(verdicts, key=EXIT_ORDER.index)
    return VERDICT_EXIT[worst]


def encode(report: ScreenReport) -> bytes:
    return msgspec.json.encode(report)


def json_schema() -> dict[str, Any]:
    """The published schema, generated from the Structs above."""
    body = msgspec.json.schema(ScreenReport)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "tuner screen --json verdict, version 1", **body}


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"

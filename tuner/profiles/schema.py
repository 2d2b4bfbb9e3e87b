"""Profile schema (v1: one card; v2: a rig of cards): the declared tables, their TOML text and the rules across them.

A profile is evidence: the card it was proven on, the setting, and (when it came from a bisect) the trials
that proved it. A rig profile (schema 2) holds one such part per card (`[[card]]`, each with its own identity,
setting and evidence) and the evidence of the whole-rig confirmation (`[rig]`).

Each table is declared once below, as a frozen dataclass whose fields carry their bounds (msgspec `Meta`), and
`tuner.core.documents` holds a parsed file to it. Validation is strict because a profile can come from another
machine or a stranger: every error names the key's path (`setting.value: expected an integer, got 'abc'`), an
unknown key is refused and nothing is coerced silently. `profiles/README.md` documents every key (a test checks
that it lists exactly the declared ones).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import tomli_w
from msgspec import Meta

from tuner import __version__
from tuner.core.documents import Misfit, Words, fit, form, one_of, show
from tuner.core.errors import UsageError
from tuner.core.models import KIND_UNITS, Phase, Verdict, printable

SCHEMA_VERSION = 2  # the newest schema this tuner reads
SINGLE_SCHEMA = 1  # one card: [device], [setting], [tuning]. Still written at 1 so older tuners read it
RIG_SCHEMA = 2  # several cards: [[card]] tables and [rig]. A tuner that reads only 1 refuses it for its version
MAX_RIG_CARDS = 64
MAX_PROFILE_BYTES = 256 * 1024  # a real profile is ~10 KiB even with hundreds of trials
MAX_STRING_CHARS = 1024  # room for a kernel-log or engine failure reason; the file cap bounds the total
MAX_TRIALS = 2000
MAX_ABS_INT = 1_000_000
MAX_ABS_FLOAT = 1e9

VENDORS = ("amd", "nvidia", "simulated")
# Sanity bounds for a recorded setting, wider than any real card's range; the target card's own range is checked
# again when applying. The sign is fixed: a profile records an undervolt, never an overvolt.
SETTING_BOUNDS = {"voltage_offset": (-500, 0), "clock_offset": (0, 3000)}
PHASES = tuple(p.value for p in Phase if p is not Phase.MANUAL)  # a profile records bisect trials only
VERDICTS = tuple(v.value for v in Verdict if v is not Verdict.STOPPED)
SENSITIVITIES = ("full", "reduced")  # bitwise comparison, or the --tolerance opt-in
DIST_BACKENDS = ("gloo", "nccl", "rccl")

HEADER = (
    "# undervolt-tuner profile (schema v1, described in profiles/README.md).\n"
    "# Apply with `tuner apply FILE`; it checks that the card is the one this was proven on.\n"
)
RIG_HEADER = (
    "# undervolt-tuner rig profile (schema v2, described in profiles/README.md): one [[card]] per card.\n"
    "# Apply with `tuner apply FILE`; each part goes to the card it was proven on (by serial, then PCI slot).\n"
)
LAYOUT = "a profile has [profile], [device], [setting], [tuning]"
RIG_LAYOUT = ("a rig profile has [profile], [rig] and [[card]] tables (each card's [device], [setting] and [tuning] "
              "go inside its [[card]])")
NAME_PATTERN = r"\A(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z"
NAME_REMEDY = "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')"
TOML = Words(integer="an integer", number="a number", string="a string", boolean="true or false",
             date_time="a date-time like 2026-01-31T12:00:00Z", table="a table", array="an array")


class ProfileError(UsageError):
    """A profile file or value that fails validation. Exit 2; nothing was applied or written."""


# --- the kinds of value --------------------------------------------------------------------------------------------
Text = Annotated[str, Meta(max_length=MAX_STRING_CHARS, pattern=r"\A[^\x00-\x1f\x7f]*\Z",
                           extra={"says": "control characters are not allowed, got {value}"})]
Name = Annotated[str, Meta(pattern=NAME_PATTERN, extra={"says": "bad profile name {value}", "remedy": NAME_REMEDY})]
Int = Annotated[int, Meta(ge=-MAX_ABS_INT, le=MAX_ABS_INT)]
Count = Annotated[int, Meta(ge=0, le=MAX_ABS_INT)]
Step = Annotated[int, Meta(ge=1, le=MAX_ABS_INT)]
Amount = Annotated[float, Meta(ge=0.0, le=MAX_ABS_FLOAT)]  # durations, throughput, power, energy: never negative
PciPair = Annotated[str, form(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}", "1002:7550")]
PciSlot = Annotated[str, form(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", "0000:03:00.0")]
Sensitivity = Annotated[str, one_of(SENSITIVITIES)]


# --- the tables ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProfileMeta:
    name: Name
    created: Annotated[datetime, Meta(tz=True)]  # UTC, whole seconds
    tool_version: Text
    schema: Annotated[int, Meta(ge=1, le=SCHEMA_VERSION)]


@dataclass(frozen=True)
class ProfileDevice:
    vendor: Annotated[str, one_of(VENDORS)]
    name: Text
    pci_id: PciPair | None = None
    subsystem_id: PciPair | None = None
    pci_slot: PciSlot | None = None
    vbios: Text | None = None
    serial: Text | None = None
    driver_version: Text | None = None
    kernel: Text | None = None
    od_format: Text | None = None

    @property
    def simulated(self) -> bool:
        return self.vendor == "simulated"

    @property
    def label(self) -> str:
        """Name as shown to people; a simulated card always says so. Escaped as a card's own name is
        (DeviceInfo.label): the file's text may hold a bidi override or a C1 control."""
        name = printable(self.name)
        return f"{name} [SIMULATED]" if self.simulated else name


@dataclass(frozen=True)
class Setting:
    kind: Annotated[str, one_of(KIND_UNITS)]  # tuner.core.models.KnobKind values
    unit: Annotated[str, one_of(KIND_UNITS.values())]
    value: Int
    lock_clock_mhz: Annotated[int, Meta(ge=1, le=10_000)] | None = None  # NVIDIA: the max clock it was proven at
    power_limit_w: Annotated[float, Meta(ge=1.0, le=5000.0)] | None = None


@dataclass(frozen=True)
class Trial:
    setting: Int
    phase: Annotated[str, one_of(PHASES)]
    verdict: Annotated[str, one_of(VERDICTS)]
    reason: Text | None = None
    duration_s: Amount | None = None
    tok_s: Amount | None = None
    power_w: Amount | None = None
    tok_per_j: Amount | None = None
    max_temp_c: Annotated[float, Meta(ge=-50.0, le=200.0)] | None = None
    fault_step: Count | None = None
    # Evidence of the undervolt that actually happened (optional: older profiles have none).
    voltage_mv: Annotated[float, Meta(ge=0.0, le=3000.0)] | None = None
    voltage_drop_mv: Annotated[float, Meta(ge=-3000.0, le=3000.0)] | None = None
    effective: bool | None = None
    pstates: Annotated[tuple[Annotated[int, Meta(ge=0, le=15)], ...],
                       Meta(max_length=16, extra={"what": "a list of performance states 0..15", "whole": True})
                       ] | None = None
    # AMD curve points the driver's range kept from the asked offset
    clamped: Annotated[tuple[Text, ...], Meta(max_length=16, extra={"what": "a list of at most 16 lines",
                                                                     "count": "expected {what}, got {value}"})
                       ] | None = None
    sensitivity: Sensitivity | None = None  # "reduced": compared with --tolerance, not bit for bit


StepCount = Annotated[int, Meta(ge=0, le=10**12)]  # compared steps: a long bound at a fast step runs millions


@dataclass(frozen=True)
class BoundPart:
    """Steps with no fault from the trials of one setting and phase that count toward a bound (issue 26)."""

    setting: Int
    phase: Annotated[str, one_of(PHASES)]
    steps: StepCount


@dataclass(frozen=True)
class ProfileBound:
    """What the passes support (`tuner.tuning.bound.Bound.to_dict()`): the per-step fault rate is below
    `rate_per_step` at `confidence`; with the step time, at most one fault per `duration_s` of this load."""

    confidence: Annotated[float, Meta(gt=0.0, lt=1.0)]
    steps: StepCount
    rate_per_step: Annotated[float, Meta(ge=0.0, le=1.0)]
    steps_per_fault: Amount
    faults: StepCount = 0
    duration_s: Amount | None = None
    hours: Amount | None = None
    step_s: Amount | None = None
    contributions: Annotated[tuple[BoundPart, ...], Meta(max_length=MAX_TRIALS, extra={
        "what": "an array of tables", "count": "{n} contributions, the limit is {hi}"})] = ()


@dataclass(frozen=True)
class Tuning:
    baseline_tok_s: Amount | None = None
    tuned_tok_s: Amount | None = None
    baseline_power_w: Amount | None = None
    tuned_power_w: Amount | None = None
    baseline_tok_per_j: Amount | None = None
    tuned_tok_per_j: Amount | None = None
    efficiency_gain_pct: Annotated[float, Meta(ge=-1000.0, le=1000.0)] | None = None
    first_failure: Int | None = None
    lowest_pass: Int | None = None
    confirmed: Int | None = None
    margin: Count | None = None
    step: Step | None = None
    resolution: Step | None = None
    trial_duration_s: Amount | None = None
    confirm_duration_s: Amount | None = None
    preset: Text | None = None
    mode: Text | None = None
    dtype: Text | None = None
    sensitivity: Sensitivity | None = None
    # issue 26: the bound asked for (--bound), the pooled bound at this setting and at the confirmed value, and
    # whether the confirmed value reached the one asked for (older profiles have none)
    bound_s: Amount | None = None
    bound: ProfileBound | None = None
    confirmed_bound: ProfileBound | None = None
    bound_met: bool | None = None
    # tools found running beside the bisect and overridden with --ignore-other-tools (tuner.actions.other_tools)
    other_tools: Annotated[tuple[Text, ...], Meta(max_length=8, extra={"what": "a list of at most 8 lines"})] | None \
        = None
    trials: Annotated[tuple[Trial, ...], Meta(max_length=MAX_TRIALS, extra={
        "what": "an array of tables ([[tuning.trials]])", "count": "{n} trials, the limit is {hi}"})] = ()


@dataclass(frozen=True)
class ProfilePart:
    """One card's share of a profile: the card it was proven on, its setting and that card's own evidence."""

    device: ProfileDevice
    setting: Setting
    tuning: Tuning | None = None


@dataclass(frozen=True)
class RigEvidence:
    """The whole-rig confirmation: every card at its setting at once, as one data-parallel job."""

    confirm_duration_s: Amount | None = None  # how long the passing confirmation ran
    attempts: Annotated[int, Meta(ge=1, le=10_000)] | None = None  # confirmations run, the passing one included
    backend: Annotated[str, one_of(DIST_BACKENDS)] | None = None  # torch.distributed backend
    mode: Text | None = None
    preset: Text | None = None
    dtype: Text | None = None
    tok_s: Amount | None = None  # the job's throughput, all cards together
    power_w: Amount | None = None  # board power, all cards together
    tok_per_j: Amount | None = None


@dataclass(frozen=True, kw_only=True)
class SingleCardDoc(ProfilePart):
    """A schema-1 file: [profile] and one card's [device], [setting] and [tuning]."""

    profile: ProfileMeta


@dataclass(frozen=True, kw_only=True)
class RigDoc:
    """A schema-2 file: [profile], [rig] and one [[card]] per card."""

    profile: ProfileMeta
    rig: RigEvidence | None = None
    card: Annotated[tuple[ProfilePart, ...], Meta(min_length=1, max_length=MAX_RIG_CARDS, extra={
        "what": "an array of tables ([[card]])", "count": "a rig profile holds {lo}..{hi} cards, got {n}"})]


def validate_name(name: str, *, path: str = "name") -> str:
    """A profile name is also a file name in the store: no separators, no `..`, 1-64 safe characters."""
    if not isinstance(name, str) or not re.search(NAME_PATTERN, name):
        raise ProfileError(f"{path}: bad profile name {show(name)}", NAME_REMEDY)
    return name


# --- reading ---------------------------------------------------------------------------------------------------
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _key(key: str) -> str:
    """A key as it may appear in a one-line message: bare keys as they are, anything else quoted and escaped."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key[:64])


def _dotted(path: tuple[str | int, ...]) -> str:
    """('card', 1, 'setting') -> 'card[1].setting'."""
    text = ""
    for seg in path:
        text += f"[{seg}]" if isinstance(seg, int) else f"{'.' if text else ''}{_key(seg)}"
    return text


def _profile_error(m: Misfit, layout: str) -> ProfileError:
    """The one line for a misfit, naming the key's path (a section at the top, a key inside a table)."""
    table, key = m.path[:-1], m.path[-1] if m.path else ""
    if m.kind == "missing":
        if not table:
            return ProfileError(f"{key}: missing section", f"a profile needs [{key}]")
        return ProfileError(f"{_dotted(m.path)}: missing", f"[{_dotted(table)}] needs {key}")
    if m.kind == "unknown":
        if not table:
            return ProfileError(f"{_dotted(m.path)}: unknown section", layout)
        known = ", ".join(m.known)
        return ProfileError(f"{_dotted(m.path)}: unknown key", f"known keys in [{_dotted(table)}]: {known}")
    return ProfileError(f"{_dotted(m.path)}: {m.detail}" if m.path else m.detail, m.remedy)


def _check_schema_version(data: dict) -> None:
    """Checked before anything else, so a newer file is refused for its version, not for its new keys."""
    meta = data.get("profile")
    if not isinstance(meta, dict) or "schema" not in meta:
        raise ProfileError("profile.schema: missing",
                           "is this an undervolt-tuner profile? it needs [profile] schema = 1")
    schema = meta["schema"]
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
        raise ProfileError(
            f"profile.schema: this profile uses schema {schema}; tuner {__version__} reads schema {SCHEMA_VERSION}",
            "upgrade the tuner to read it",
        )


@dataclass(frozen=True)
class Profile:
    meta: ProfileMeta
    device: ProfileDevice
    setting: Setting
    tuning: Tuning | None = None
    source: Path | None = field(default=None, compare=False)  # where it was read from, if anywhere
    # A rig profile: every card's part (device, setting, tuning above are the first card's, for a one-line
    # summary; anything that writes to a card must go through `parts`). Empty for a single-card profile.
    rig_parts: tuple[ProfilePart, ...] = ()
    rig: RigEvidence | None = None  # the whole-rig confirmation's evidence, when there was one

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def store_name(self) -> str:
        """The name it is stored and shown under: its file's stem (an imported `abc.toml` is `abc`), else its own."""
        return self.source.stem if self.source else self.name

    @property
    def is_rig(self) -> bool:
        """A rig profile (schema 2): one part per card, applied together."""
        return bool(self.rig_parts)

    @property
    def parts(self) -> tuple[ProfilePart, ...]:
        """Every card's part: the rig's, or the single card's as a one-part tuple (so callers can loop either)."""
        return self.rig_parts or (ProfilePart(self.device, self.setting, self.tuning),)

    @classmethod
    def from_dict(cls, data: object, *, source: Path | None = None) -> Profile:
        """Validate a parsed document. Raises ProfileError naming the first bad key's path."""
        if not isinstance(data, dict):
            raise ProfileError(f"expected a TOML document (a table), got {TOML.given(data)}")
        _check_schema_version(data)
        try:
            if "card" not in data:
                single = fit(data, SingleCardDoc, TOML, closed=True)
                meta = _checked_meta(single.profile, SINGLE_SCHEMA)
                _check_setting(single.setting, "setting")
                return cls(meta, single.device, single.setting, single.tuning, source)
            rig = fit(data, RigDoc, TOML, closed=True)
        except Misfit as m:
            raise _profile_error(m, RIG_LAYOUT if "card" in data else LAYOUT) from None
        meta = _checked_meta(rig.profile, RIG_SCHEMA)
        _check_cards(rig.card)
        first = rig.card[0]
        return cls(meta, first.device, first.setting, first.tuning, source, rig_parts=rig.card, rig=rig.rig)

    @classmethod
    def from_toml(cls, text: str, *, source: Path | None = None) -> Profile:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"not valid TOML: {e}", "fix the file or export it again") from None
        except RecursionError:  # pathologically nested arrays
            raise ProfileError("not valid TOML: nested too deeply") from None
        except ValueError as e:  # an integer over Python's 4,300-digit conversion limit, and the like
            raise ProfileError(f"not a usable TOML document: {str(e)[:120]}", "fix the file or export it again"
                               ) from None
        return cls.from_dict(data, source=source)

    @classmethod
    def from_bytes(cls, raw: bytes, *, source: Path | None = None) -> Profile:
        if len(raw) > MAX_PROFILE_BYTES:
            raise ProfileError(f"file is larger than {MAX_PROFILE_BYTES // 1024} KiB; not a profile")
        if b"\x00" in raw:
            raise ProfileError("binary data (NUL bytes); a profile is a TOML text file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProfileError(
                f"not UTF-8 text (bad byte at offset {e.start}); a profile is a TOML text file") from None
        return cls.from_toml(text, source=source)

    def to_dict(self) -> dict:
        """The TOML document as a dict; keys whose value is unknown are left out (TOML has no null)."""
        if self.is_rig:
            return _dense(RigDoc(profile=self.meta, rig=self.rig, card=self.rig_parts))
        return {"profile": _dense(self.meta), **_dense(ProfilePart(self.device, self.setting, self.tuning))}

    def to_json_dict(self) -> dict:
        doc = self.to_dict()
        doc["profile"]["created"] = format_created(self.meta.created)
        return doc

    def to_toml(self) -> str:
        return (RIG_HEADER if self.is_rig else HEADER) + tomli_w.dumps(self.to_dict())

    def renamed(self, name: str) -> Profile:
        return replace(self, meta=replace(self.meta, name=validate_name(name, path="--name")))


def _dense(value: Any) -> Any:
    """A table as TOML has it: a key at its default (unknown, or no trials) is left out; tuples are arrays."""
    if is_dataclass(value):
        return {f.name: _dense(v) for f in fields(value) if (v := getattr(value, f.name)) != f.default}
    return [_dense(v) for v in value] if isinstance(value, tuple) else value


# --- the rules across keys (a shape cannot say them) ----------------------------------------------------------
def _checked_meta(meta: ProfileMeta, want: int) -> ProfileMeta:
    """The schema the layout says, and the date-time in UTC."""
    if meta.schema != want:
        what = ("a rig profile ([[card]] tables)" if want == RIG_SCHEMA else
                "a single-card profile ([device], [setting])")
        raise ProfileError(f"profile.schema: {what} is schema {want}, got {meta.schema}",
                           "schema 1 holds one card's [device] and [setting]; schema 2 holds [[card]] tables")
    try:
        return replace(meta, created=meta.created.astimezone(UTC))
    except (OverflowError, ValueError):  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise ProfileError(f"profile.created: the date-time {show(meta.created)} is out of range in UTC",
                           "write a date-time between years 1 and 9999, in UTC with a trailing Z") from None


def _check_setting(setting: Setting, path: str) -> None:
    if KIND_UNITS[setting.kind] != setting.unit:
        raise ProfileError(f"{path}.unit: a {setting.kind} is in {KIND_UNITS[setting.kind]}, got {setting.unit!r}")
    lo, hi = SETTING_BOUNDS[setting.kind]
    if setting.kind == "voltage_offset" and setting.value > hi:
        raise ProfileError(
            f"{path}.value: {setting.value:+d} mV would raise the voltage above stock (overvolt)",
            "a profile records an undervolt: 0 mV or below",
        )
    if not lo <= setting.value <= hi:
        raise ProfileError(f"{path}.value: {setting.value:+d} {setting.unit} is outside {lo:+d}..{hi:+d} "
                           f"{setting.unit} for a {setting.kind}")
    if setting.lock_clock_mhz is not None and setting.kind != "clock_offset":
        raise ProfileError(f"{path}.lock_clock_mhz: only a clock_offset (NVIDIA) setting has a locked clock")


def _check_cards(parts: tuple[ProfilePart, ...]) -> None:
    """Each part names a card no other part names (by serial or slot), because `tuner apply` finds each part's card
    by its serial, then by its PCI slot."""
    for i, part in enumerate(parts):
        path = f"card[{i}]"
        _check_setting(part.setting, f"{path}.setting")
        if not part.device.serial and not part.device.pci_slot:
            raise ProfileError(f"{path}.device: needs a serial or a pci_slot",
                               "a rig profile finds each part's card by its serial, then its PCI slot")
        for j, other in enumerate(parts[:i]):
            for attr in ("serial", "pci_slot"):
                mine, theirs = getattr(part.device, attr), getattr(other.device, attr)
                if mine and theirs and mine.lower() == theirs.lower():
                    raise ProfileError(f"{path}.device.{attr}: {show(mine)} is card[{j}]'s too",
                                       "a rig profile holds one part per card")


def format_created(created: datetime) -> str:
    return created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)

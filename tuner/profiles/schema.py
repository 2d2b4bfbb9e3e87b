"""Profile schema (v1: one card; v2: a rig of cards): dataclasses, strict validation and TOML text.

A profile is evidence: the card it was proven on, the setting, and (when it came from a bisect) the trials
that proved it. A rig profile (schema 2) holds one such part per card (`[[card]]`, each with its own identity,
setting and evidence) and the evidence of the whole-rig confirmation (`[rig]`).

Validation is strict because a profile can come from another machine or a stranger: every
error names the key's path (`setting.value: expected an integer, got 'abc'`) and nothing is coerced silently.
The schema is documented field by field in `profiles/README.md`; keep the two in step.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tomli_w

from tuner import __version__
from tuner.core.errors import UsageError
from tuner.core.models import Phase, Verdict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
KIND_UNITS = {"voltage_offset": "mV", "clock_offset": "MHz"}
# Sanity bounds for a recorded setting, wider than any real card's range; the target card's own range is checked
# again when applying. The sign is fixed: a profile records an undervolt, never an overvolt.
SETTING_BOUNDS = {"voltage_offset": (-500, 0), "clock_offset": (0, 3000)}
PHASES = tuple(p.value for p in Phase if p is not Phase.MANUAL)  # a profile records bisect trials only
VERDICTS = tuple(v.value for v in Verdict if v is not Verdict.STOPPED)
SENSITIVITIES = ("full", "reduced")  # bitwise comparison, or the --tolerance opt-in

HEADER = (
    "# undervolt-tuner profile (schema v1, described in profiles/README.md).\n"
    "# Apply with `tuner apply FILE`; it checks that the card is the one this was proven on.\n"
)
RIG_HEADER = (
    "# undervolt-tuner rig profile (schema v2, described in profiles/README.md): one [[card]] per card.\n"
    "# Apply with `tuner apply FILE`; each part goes to the card it was proven on (by serial, then PCI slot).\n"
)


class ProfileError(UsageError):
    """A profile file or value that fails validation. Exit 2; nothing was applied or written."""


# --- field checkers ----------------------------------------------------------------------------------------------
# Each takes (value, path) and returns the normalised value or raises ProfileError naming `path`.

T = TypeVar("T")
Check = Callable[[object, str], T]  # (value, path) -> the normalised value

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _key(key: str) -> str:
    """A key as it may appear in a one-line message: bare keys as they are, anything else quoted and escaped."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key[:64])


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "a table",
            list: "an array", datetime: "a date-time"}.get(type(value), type(value).__name__)


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{path}: expected a string, got {_type_name(value)} {_show(value)}")
    if len(value) > MAX_STRING_CHARS:
        raise ProfileError(f"{path}: string is {len(value)} characters long, the limit is {MAX_STRING_CHARS}")
    if _CONTROL.search(value):
        raise ProfileError(f"{path}: control characters are not allowed, got {_show(value)}")
    return value


def _int(lo: int = -MAX_ABS_INT, hi: int = MAX_ABS_INT) -> Check[int]:
    def check(value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{path}: expected an integer, got {_type_name(value)} {_show(value)}")
        if not lo <= value <= hi:
            raise ProfileError(f"{path}: {_show(value)} is outside {lo}..{hi}")
        return value

    return check


def _float(lo: float = -MAX_ABS_FLOAT, hi: float = MAX_ABS_FLOAT) -> Check[float]:
    def check(value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(f"{path}: expected a number, got {_type_name(value)} {_show(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProfileError(f"{path}: expected a finite number, got {value}")
        if not lo <= value <= hi:
            raise ProfileError(f"{path}: {_show(value)} is outside {lo:g}..{hi:g}")
        return float(value)

    return check


def _choice(options: tuple[str, ...]) -> Check[str]:
    def check(value: object, path: str) -> str:
        text = _str(value, path)
        if text not in options:
            raise ProfileError(f"{path}: expected one of {', '.join(options)}, got {_show(text)}")
        return text

    return check


def _pattern(regex: str, example: str) -> Check[str]:
    compiled = re.compile(regex)

    def check(value: object, path: str) -> str:
        text = _str(value, path)
        if not compiled.fullmatch(text):
            raise ProfileError(f"{path}: {_show(text)} is not in the form {example}")
        return text

    return check


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{path}: expected true or false, got {_type_name(value)} {_show(value)}")
    return value


def _pstates(value: object, path: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 16 or not all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 15 for p in value
    ):
        raise ProfileError(f"{path}: expected a list of performance states 0..15, got {_show(value)}")
    return tuple(value)


def _lines(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > 16:
        raise ProfileError(f"{path}: expected a list of at most 16 lines, got {_show(value)}")
    return tuple(_str(v, f"{path}[{i}]") for i, v in enumerate(value))


def _utc_datetime(value: object, path: str) -> datetime:
    if not isinstance(value, datetime):
        raise ProfileError(f"{path}: expected a date-time like 2026-01-31T12:00:00Z, got {_type_name(value)} "
                           f"{_show(value)}")
    if value.tzinfo is None:
        raise ProfileError(f"{path}: the date-time needs a time zone (write it in UTC with a trailing Z)")
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError):  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise ProfileError(f"{path}: the date-time {_show(value)} is out of range in UTC",
                           "write a date-time between years 1 and 9999, in UTC with a trailing Z") from None


_pci_pair = _pattern(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}", "1002:7550")
_pos = _float(0.0)
_count_int = _int(0)

# --- the tables ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileMeta:
    name: str
    created: datetime  # UTC, whole seconds
    tool_version: str
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class ProfileDevice:
    vendor: str
    name: str
    pci_id: str | None = None
    subsystem_id: str | None = None
    pci_slot: str | None = None
    vbios: str | None = None
    serial: str | None = None
    driver_version: str | None = None
    kernel: str | None = None
    od_format: str | None = None

    @property
    def simulated(self) -> bool:
        return self.vendor == "simulated"

    @property
    def label(self) -> str:
        """Name as shown to people; a simulated card always says so."""
        return f"{self.name} [SIMULATED]" if self.simulated else self.name


@dataclass(frozen=True)
class Setting:
    kind: str  # "voltage_offset" | "clock_offset" (tuner.core.models.KnobKind values)
    unit: str  # "mV" | "MHz"
    value: int
    lock_clock_mhz: int | None = None  # NVIDIA: the max graphics clock the offset was proven at
    power_limit_w: float | None = None


@dataclass(frozen=True)
class Trial:
    setting: int
    phase: str
    verdict: str
    reason: str | None = None
    duration_s: float | None = None
    tok_s: float | None = None
    power_w: float | None = None
    tok_per_j: float | None = None
    max_temp_c: float | None = None
    fault_step: int | None = None
    # Evidence of the undervolt that actually happened (optional: older profiles have none).
    voltage_mv: float | None = None
    voltage_drop_mv: float | None = None
    effective: bool | None = None
    pstates: tuple[int, ...] | None = None
    clamped: tuple[str, ...] | None = None  # AMD curve points the driver's range kept from the asked offset
    sensitivity: str | None = None


@dataclass(frozen=True)
class Tuning:
    baseline_tok_s: float | None = None
    tuned_tok_s: float | None = None
    baseline_power_w: float | None = None
    tuned_power_w: float | None = None
    baseline_tok_per_j: float | None = None
    tuned_tok_per_j: float | None = None
    efficiency_gain_pct: float | None = None
    first_failure: int | None = None
    lowest_pass: int | None = None
    confirmed: int | None = None
    margin: int | None = None
    step: int | None = None
    resolution: int | None = None
    trial_duration_s: float | None = None
    confirm_duration_s: float | None = None
    preset: str | None = None
    mode: str | None = None
    dtype: str | None = None
    sensitivity: str | None = None
    trials: tuple[Trial, ...] = ()


@dataclass(frozen=True)
class ProfilePart:
    """One card's share of a profile: the card it was proven on, its setting and that card's own evidence."""

    device: ProfileDevice
    setting: Setting
    tuning: Tuning | None = None


@dataclass(frozen=True)
class RigEvidence:
    """The whole-rig confirmation: every card at its setting at once, as one data-parallel job."""

    confirm_duration_s: float | None = None  # how long the passing confirmation ran
    attempts: int | None = None  # confirmations run, the passing one included (each failure backed cards off)
    backend: str | None = None  # torch.distributed backend: gloo, nccl or rccl
    mode: str | None = None
    preset: str | None = None
    dtype: str | None = None
    tok_s: float | None = None  # the job's throughput, all cards together
    power_w: float | None = None  # board power, all cards together
    tok_per_j: float | None = None


# key -> (checker, required). Order is the order written to TOML.
Spec = dict[str, tuple[Check[object] | None, bool]]
META_SPEC: Spec = {
    "name": (lambda v, p: validate_name(_str(v, p), path=p), True),
    "created": (_utc_datetime, True),
    "tool_version": (_str, True),
    "schema": (_int(1, SCHEMA_VERSION), True),
}
DEVICE_SPEC: Spec = {
    "vendor": (_choice(VENDORS), True),
    "name": (_str, True),
    "pci_id": (_pci_pair, False),
    "subsystem_id": (_pci_pair, False),
    "pci_slot": (_pattern(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", "0000:03:00.0"), False),
    "vbios": (_str, False),
    "serial": (_str, False),
    "driver_version": (_str, False),
    "kernel": (_str, False),
    "od_format": (_str, False),
}
SETTING_SPEC: Spec = {
    "kind": (_choice(tuple(KIND_UNITS)), True),
    "unit": (_choice(tuple(KIND_UNITS.values())), True),
    "value": (_int(), True),
    "lock_clock_mhz": (_int(1, 10_000), False),
    "power_limit_w": (_float(1.0, 5000.0), False),
}
TRIAL_SPEC: Spec = {
    "setting": (_int(), True),
    "phase": (_choice(PHASES), True),
    "verdict": (_choice(VERDICTS), True),
    "reason": (_str, False),
    "duration_s": (_pos, False),
    "tok_s": (_pos, False),
    "power_w": (_pos, False),
    "tok_per_j": (_pos, False),
    "max_temp_c": (_float(-50.0, 200.0), False),
    "fault_step": (_count_int, False),
    "voltage_mv": (_float(0.0, 3000.0), False),
    "voltage_drop_mv": (_float(-3000.0, 3000.0), False),
    "effective": (_bool, False),
    "pstates": (_pstates, False),
    "clamped": (_lines, False),
    "sensitivity": (_choice(SENSITIVITIES), False),
}
TUNING_SPEC: Spec = {
    "baseline_tok_s": (_pos, False),
    "tuned_tok_s": (_pos, False),
    "baseline_power_w": (_pos, False),
    "tuned_power_w": (_pos, False),
    "baseline_tok_per_j": (_pos, False),
    "tuned_tok_per_j": (_pos, False),
    "efficiency_gain_pct": (_float(-1000.0, 1000.0), False),
    "first_failure": (_int(), False),
    "lowest_pass": (_int(), False),
    "confirmed": (_int(), False),
    "margin": (_count_int, False),
    "step": (_int(1, MAX_ABS_INT), False),
    "resolution": (_int(1, MAX_ABS_INT), False),
    "trial_duration_s": (_pos, False),
    "confirm_duration_s": (_pos, False),
    "preset": (_str, False),
    "mode": (_str, False),
    "dtype": (_str, False),
    "sensitivity": (_choice(SENSITIVITIES), False),
    "trials": (None, False),  # checked by _trials
}
DIST_BACKENDS = ("gloo", "nccl", "rccl")
RIG_SPEC: Spec = {
    "confirm_duration_s": (_pos, False),
    "attempts": (_int(1, 10_000), False),
    "backend": (_choice(DIST_BACKENDS), False),
    "mode": (_str, False),
    "preset": (_str, False),
    "dtype": (_str, False),
    "tok_s": (_pos, False),
    "power_w": (_pos, False),
    "tok_per_j": (_pos, False),
}
CARD_SPEC: Spec = {"device": (None, True), "setting": (None, True), "tuning": (None, False)}  # each by _part
TOP_LEVEL = ("profile", "device", "setting", "tuning")
RIG_TOP_LEVEL = ("profile", "rig", "card")
RIG_LAYOUT = ("a rig profile has [profile], [rig] and [[card]] tables (each card's [device], [setting] and [tuning] "
              "go inside its [[card]])")

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_name(name: str, *, path: str = "name") -> str:
    """A profile name is also a file name in the store: no separators, no `..`, 1-64 safe characters."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name:
        raise ProfileError(
            f"{path}: bad profile name {_show(name)}",
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')",
        )
    return name


def _table(data: object, path: str, spec: Spec) -> dict[str, Any]:
    """The checked values by key (Any: each key's type is its checker's; the dataclass takes them by name)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a table, got {_type_name(data)} {_show(data)}")
    for key in data:
        if key not in spec:
            raise ProfileError(f"{path}.{_key(key)}: unknown key", f"known keys in [{path}]: {', '.join(spec)}")
    out: dict[str, Any] = {}
    for key, (check, required) in spec.items():
        if key not in data:
            if required:
                raise ProfileError(f"{path}.{key}: missing", f"[{path}] needs {key}")
            continue
        out[key] = data[key] if check is None else check(data[key], f"{path}.{key}")
    return out


def _trials(data: object, path: str) -> tuple[Trial, ...]:
    if not isinstance(data, list):
        raise ProfileError(f"{path}: expected an array of tables ([[tuning.trials]]), got {_type_name(data)}")
    if len(data) > MAX_TRIALS:
        raise ProfileError(f"{path}: {len(data)} trials, the limit is {MAX_TRIALS}")
    return tuple(Trial(**_table(t, f"{path}[{i}]", TRIAL_SPEC)) for i, t in enumerate(data))


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
            raise ProfileError(f"expected a TOML document (a table), got {_type_name(data)}")
        _check_schema_version(data)
        rig = "card" in data
        top = RIG_TOP_LEVEL if rig else TOP_LEVEL
        for key in data:
            if key not in top:
                layout = (RIG_LAYOUT if rig else f"a profile has [{'], ['.join(top)}]")
                raise ProfileError(f"{_key(key)}: unknown section", layout)
        for key in ("profile",) if rig else ("profile", "device", "setting"):
            if key not in data:
                raise ProfileError(f"{key}: missing section", f"a profile needs [{key}]")
        meta = ProfileMeta(**_table(data["profile"], "profile", META_SPEC))
        want = RIG_SCHEMA if rig else SINGLE_SCHEMA
        if meta.schema != want:
            what = "a rig profile ([[card]] tables)" if rig else "a single-card profile ([device], [setting])"
            raise ProfileError(f"profile.schema: {what} is schema {want}, got {meta.schema}",
                               "schema 1 holds one card's [device] and [setting]; schema 2 holds [[card]] tables")
        if not rig:
            part = _part(data, "")
            return cls(meta, part.device, part.setting, part.tuning, source)
        parts = _cards(data["card"])
        evidence = RigEvidence(**_table(data["rig"], "rig", RIG_SPEC)) if "rig" in data else None
        first = parts[0]
        return cls(meta, first.device, first.setting, first.tuning, source, rig_parts=parts, rig=evidence)

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
            doc: dict[str, object] = {"profile": _dense(self.meta)}
            if self.rig is not None:
                doc["rig"] = _dense(self.rig)
            doc["card"] = [_part_dict(part) for part in self.rig_parts]
            return doc
        return {"profile": _dense(self.meta), **_part_dict(ProfilePart(self.device, self.setting, self.tuning))}

    def to_json_dict(self) -> dict:
        doc = self.to_dict()
        doc["profile"]["created"] = format_created(self.meta.created)
        return doc

    def to_toml(self) -> str:
        return (RIG_HEADER if self.is_rig else HEADER) + tomli_w.dumps(self.to_dict())

    def renamed(self, name: str) -> Profile:
        return replace(self, meta=replace(self.meta, name=validate_name(name, path="--name")))


def _part(data: dict, prefix: str) -> ProfilePart:
    """One card's [device], [setting] and optional [tuning]; `prefix` ("" or "card[2].") starts every path."""
    device = ProfileDevice(**_table(data["device"], f"{prefix}device", DEVICE_SPEC))
    setting = Setting(**_table(data["setting"], f"{prefix}setting", SETTING_SPEC))
    _check_setting(setting, f"{prefix}setting")
    tuning = None
    if "tuning" in data:
        raw = _table(data["tuning"], f"{prefix}tuning", TUNING_SPEC)
        if "trials" in raw:
            raw["trials"] = _trials(raw["trials"], f"{prefix}tuning.trials")
        tuning = Tuning(**raw)
    return ProfilePart(device, setting, tuning)


def _cards(data: object) -> tuple[ProfilePart, ...]:
    """The [[card]] tables: 1..MAX_RIG_CARDS parts, each naming a card no other part names (by serial or slot),
    because `tuner apply` finds each part's card by its serial, then by its PCI slot."""
    if not isinstance(data, list):
        raise ProfileError(f"card: expected an array of tables ([[card]]), got {_type_name(data)}")
    if not 1 <= len(data) <= MAX_RIG_CARDS:
        raise ProfileError(f"card: a rig profile holds 1..{MAX_RIG_CARDS} cards, got {len(data)}")
    parts: list[ProfilePart] = []
    for i, raw in enumerate(data):
        path = f"card[{i}]"
        _table(raw, path, CARD_SPEC)  # a table, with device and setting, and nothing unknown
        part = _part(raw, f"{path}.")
        if not part.device.serial and not part.device.pci_slot:
            raise ProfileError(f"{path}.device: needs a serial or a pci_slot",
                               "a rig profile finds each part's card by its serial, then its PCI slot")
        for j, other in enumerate(parts):
            for attr in ("serial", "pci_slot"):
                mine, theirs = getattr(part.device, attr), getattr(other.device, attr)
                if mine and theirs and mine.lower() == theirs.lower():
                    raise ProfileError(f"{path}.device.{attr}: {_show(mine)} is card[{j}]'s too",
                                       "a rig profile holds one part per card")
        parts.append(part)
    return tuple(parts)


def _part_dict(part: ProfilePart) -> dict[str, object]:
    doc: dict[str, object] = {"device": _dense(part.device), "setting": _dense(part.setting)}
    if part.tuning is not None:
        tuning = _dense(part.tuning)
        tuning.pop("trials", None)
        if part.tuning.trials:
            tuning["trials"] = [_dense(t) for t in part.tuning.trials]
        doc["tuning"] = tuning
    return doc


def _check_setting(setting: Setting, path: str = "setting") -> None:
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


def _dense(obj: DataclassInstance) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) is not None}


def format_created(created: datetime) -> str:
    return created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)

"""The portable reference: a card's stock trajectory with the fingerprint that says where its bits can be expected.

`tuner reference record` writes one, `tuner screen --reference FILE` compares cards with it, `tuner profile export`
carries a profile's beside it (docs/screen.md). The file is gzip-compressed JSON (so `zcat FILE | jq` reads it):

    {"format": "tuner-reference-bundle", "version": 1, "created": "...Z", "tuner_version": "0.1.0",
     "card": {vendor, model, pci_id, vbios_family, driver_version},            -- must match (bitwise)
     "origin": {host, device_id, pci_slot, serial, subsystem_id, vbios, kernel, simulated},   -- may differ
     "recording": {tier, load_s, steps, median_step_ms, replayed_steps, repeatable, eval_losses, bpb},
     "trajectory": {...the engine's reference file (tuner/engine/reference.py), as the engine wrote it...},
     "sha256": "<hex>"}

**The trajectory is bundled, not re-encoded**: `trajectory` is the engine's own reference document (its format and
version, its fingerprint, canary and per-step digests), checked with the engine's own rules
(`tuner.engine.reference.parse_reference`) when the bundle is read, and written back out as a file for the engine's
`--reference` when a screen runs (`materialize`). Its fingerprint is the engine half of the must-match fields; the
engine checks it itself at start-up and refuses a run that differs (the screen turns that refusal into
`incomparable`, naming the keys).

**Tamper-evident**: `sha256` is the SHA-256 of the canonical JSON (sorted keys, no spaces) of every other field,
fingerprint and content together: a changed digest, a changed driver field or a cut file no longer matches. It
catches damage and edits; it is not a signature (whoever edits the file can recompute it), which a fleet that
needs one adds around the file (e.g. a detached signature of its bytes).

**Must match** (`must_match`), for a bitwise comparison: what decides which kernels run and what they compute.
**May differ** (`origin`): where the reference was recorded (host, slot, serial, board partner, full VBIOS,
kernel): recorded for the report, never compared. **Tolerance** (`TOLERANCE_KEYS`): the workload alone, for the
held-out loss comparison across different hardware (docs/screen.md). Each field's reason is in docs/screen.md.

Pure functions and one reader/writer; no torch (the engine's reference module is torch-free).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from tuner import __version__
from tuner.core.atomic import write_atomic
from tuner.core.documents import Misfit, Words, fit
from tuner.core.errors import UsageError
from tuner.core.kernel_files import NotARegularFile, read_regular
from tuner.core.models import DeviceInfo
from tuner.engine.reference import MAX_FILE_BYTES as MAX_REFERENCE_BYTES
from tuner.engine.reference import Reference, ReferenceProblem, parse_reference, save_reference
from tuner.profiles.schema import format_created, utc_now

FORMAT = "tuner-reference-bundle"
VERSION = 1
SUFFIX = ".ref"
MAX_FILE_BYTES = 64 * 1024 * 1024  # compressed; a 15-minute recording of the tiny preset is ~2 MiB
MAX_JSON_BYTES = MAX_REFERENCE_BYTES  # decompressed: a damaged or hostile file is not inflated past a reference

# Vendors whose PCI device id alone does not name the SKU: one AMD device id covers several products that differ
# in compute units (Navi 21's 1002:73bf is the RX 6800, 6800 XT and 6900 XT, told apart by revision and VBIOS
# part number), and the BLAS libraries pick kernels and split reductions by compute-unit count. NVIDIA's device id
# names the SKU; its VBIOS differs between board partners without changing the arithmetic.
VBIOS_FAMILY_VENDORS = frozenset({"amd", "simulated"})

# The engine fingerprint keys that a held-out loss comparison needs equal: the workload (model shape, batch, data,
# seed, dtype) and nothing of the platform (device, driver, torch, kernels). The tuner version is checked apart.
TOLERANCE_KEYS = ("protocol", "preset", "depth", "width", "head_dim", "seq_len", "batch_size", "seed", "dtype",
                  "data_sha256", "vocab", "window_pattern", "value_embeds", "tokenizer_sha256")

WORDS = Words(integer="a whole number", number="a number", string="a string", boolean="true or false",
              date_time="a date-time", table="an object", array="a list")

Text = Annotated[str, Meta(max_length=500)]
Hex64 = Annotated[str, Meta(pattern=r"\A[0-9a-f]{64}\Z", extra={"form": "64 hex digits"})]


class CardFields(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The card's half of the must-match fields (None: not known, or not compared for this vendor)."""

    vendor: Text
    model: Text
    pci_id: Text | None = None
    vbios_family: Text | None = None
    driver_version: Text | None = None


class Origin(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where it was recorded: may differ from the card screened, never compared."""

    host: Text | None = None
    device_id: Text
    pci_slot: Text | None = None
    serial: Text | None = None
    subsystem_id: Text | None = None
    vbios: Text | None = None
    kernel: Text | None = None
    simulated: bool = False


class Recording(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the trajectory was recorded and proven: at stock, for `load_s` of the tier's load, then replayed in a
    second engine process bit for bit (`repeatable`, `replayed_steps`)."""

    tier: Text
    load_s: Annotated[float, Meta(gt=0)]
    steps: Annotated[int, Meta(ge=1)]
    median_step_ms: Annotated[float, Meta(gt=0)] | None = None
    repeatable: bool
    replayed_steps: Annotated[int, Meta(ge=0)]
    mode: Text = "train"
    eval_losses: tuple[float, ...] = ()  # held-out loss of each fixed window after `steps` steps (tolerance mode)
    bpb: float | None = None


class Bundle(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: Text
    version: int
    created: Text
    tuner_version: Text
    card: CardFields
    origin: Origin
    recording: Recording
    trajectory: dict[str, Any]
    sha256: Hex64 = "0" * 64

    # --- the fingerprint ----------------------------------------------------------------------------------------

    @property
    def engine_fingerprint(self) -> dict[str, Any]:
        return dict(self.trajectory.get("fingerprint") or {})

    @property
    def preset(self) -> str | None:
        value = self.engine_fingerprint.get("preset")
        return value if isinstance(value, str) else None

    @property
    def steps(self) -> int:
        return int(self.trajectory.get("steps") or 0)

    def must_match(self) -> dict[str, object]:
        """Every must-match field, flat: `tuner_version`, `card.*` and `engine.*` (the engine's fingerprint)."""
        return {"tuner_version": self.tuner_version, **card_must_match(self.card),
                **{f"engine.{k}": v for k, v in sorted(self.engine_fingerprint.items())}}

    def may_differ(self) -> dict[str, object]:
        return {f"origin.{f}": getattr(self.origin, f) for f in self.origin.__struct_fields__}

    def trajectory_reference(self) -> Reference:
        return parse_reference(self.trajectory, "the bundled trajectory")

    def summary(self) -> dict[str, Any]:
        """What a report says about the reference used (no digests)."""
        return {"sha256": self.sha256, "tuner_version": self.tuner_version, "created": self.created,
                "preset": self.preset, "steps": self.steps, "tier": self.recording.tier,
                "load_s": self.recording.load_s, "card": msgspec.to_builtins(self.card),
                "origin": msgspec.to_builtins(self.origin)}


def card_must_match(card: CardFields) -> dict[str, object]:
    return {f"card.{f}": getattr(card, f) for f in card.__struct_fields__}


def vbios_family(vbios: str | None) -> str | None:
    """The VBIOS's family: its part number without the revision (the last `-` or `.` field).

    >>> vbios_family("113-D7170100-100"), vbios_family("SIM.000.000"), vbios_family(None)
    ('113-D7170100', 'SIM.000', None)
    """
    if not vbios:
        return None
    sep = "-" if "-" in vbios else "."
    head, found, _ = vbios.rpartition(sep)
    return head if found and head else vbios


def card_fields(device: DeviceInfo) -> CardFields:
    """The must-match half a card gives from its driver: vendor, model, PCI id, VBIOS family (where it names the
    SKU), driver version."""
    return CardFields(vendor=device.vendor, model=device.name, pci_id=device.pci_id,
                      vbios_family=vbios_family(device.vbios) if device.vendor in VBIOS_FAMILY_VENDORS else None,
                      driver_version=device.driver_version)


def origin_fields(device: DeviceInfo) -> Origin:
    return Origin(host=socket.gethostname(), device_id=device.id, pci_slot=device.pci_slot, serial=device.serial,
                  subsystem_id=device.subsystem_id, vbios=device.vbios, kernel=platform.release(),
                  simulated=device.simulated)


@dataclass(frozen=True)
class Difference:
    """One must-match field that differs: the reference's value and this card's (or this run's)."""

    field: str
    reference: object
    here: object

    def text(self) -> str:
        return f"{self.field}: reference {self.reference!r}, this card {self.here!r}"


def card_differences(bundle: Bundle, device: DeviceInfo) -> list[Difference]:
    """The must-match fields this tuner and this card give that differ from the bundle's (the engine's half is
    checked by the engine when it starts)."""
    here = {"tuner_version": __version__, **card_must_match(card_fields(device))}
    theirs = {"tuner_version": bundle.tuner_version, **card_must_match(bundle.card)}
    return [Difference(k, theirs[k], here[k]) for k in theirs if theirs[k] != here[k]]


def engine_differences(bundle: Bundle, keys: list[str], reason: str) -> list[Difference]:
    """The engine's refusal (the keys it named) as Differences; this run's value is in `reason` only."""
    fp = bundle.engine_fingerprint
    out = []
    for key in keys:
        marker = f"{key}: reference {fp.get(key)!r}, this run "
        here: object = reason.split(marker, 1)[1].split("; ", 1)[0] if marker in reason else "?"
        out.append(Difference(f"engine.{key}", fp.get(key), here))
    return out


def tolerance_differences(bundle: Bundle, workload: Mapping[str, object]) -> list[Difference]:
    """For the tolerance mode: the workload keys that differ (`workload`: this run's engine fingerprint)."""
    fp = bundle.engine_fingerprint
    out = [Difference("tuner_version", bundle.tuner_version, __version__)] if bundle.tuner_version != __version__ \
        else []
    return out + [Difference(f"engine.{k}", fp.get(k), workload.get(k)) for k in TOLERANCE_KEYS
                  if k in fp and fp.get(k) != workload.get(k)]


# --- reading and writing --------------------------------------------------------------------------------------------


class BundleProblem(UsageError):
    """The file is not a reference bundle this tuner can use (nothing was run, nothing changed)."""


def _content_hash(doc: Mapping[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_bundle(*, device: DeviceInfo, recording: Recording, trajectory: Reference,
                 created: datetime | None = None) -> Bundle:
    """A sealed bundle (its hash set) from a recorded trajectory on `device`."""
    stamp = format_created(created or utc_now())
    doc = {"format": FORMAT, "version": VERSION, "created": stamp, "tuner_version": __version__,
           "card": msgspec.to_builtins(card_fields(device)), "origin": msgspec.to_builtins(origin_fields(device)),
           "recording": msgspec.to_builtins(recording), "trajectory": trajectory.to_json()}
    return seal(doc)


def seal(doc: Mapping[str, Any]) -> Bundle:
    """`doc` with its hash set, as a Bundle (tests use it to make a consistent bundle with one field changed)."""
    bundle = fit({k: v for k, v in doc.items() if k != "sha256"}, Bundle, WORDS)
    return msgspec.structs.replace(bundle, sha256=_content_hash(msgspec.to_builtins(bundle)))


def encode(bundle: Bundle) -> bytes:
    """gzip of the JSON (mtime 0: the same bundle gives the same bytes)."""
    raw = json.dumps(msgspec.to_builtins(bundle), separators=(",", ":"), allow_nan=False).encode()
    return gzip.compress(raw, compresslevel=9, mtime=0)


def write_bundle(bundle: Bundle, path: Path, *, overwrite: bool = False) -> int:
    """Write atomically; returns the size in bytes. Refuses to replace a file unless `overwrite`."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists", "pass --overwrite to replace it, or choose another --out")
    if path.is_dir():
        raise UsageError(f"{path} is a directory", "give a file name, e.g. --out stock.ref")
    data = encode(bundle)
    write_atomic(path, data)
    return len(data)


def kib(size_bytes: int) -> str:
    """A bundle's size as a saved or exported profile's line says it: `123.4 KiB`."""
    return f"{size_bytes / 1024:.1f} KiB"


def read_bundle(path: Path) -> Bundle:
    """Read, decompress, validate and check the hash; every problem is one BundleProblem naming the file."""
    path = Path(path)
    where = f"reference {path}"
    try:
        data = read_regular(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise BundleProblem(f"{where}: no such file",
                            "record one with `tuner reference record --device ID --out FILE`") from None
    except PermissionError:
        raise BundleProblem(f"{where}: permission denied", "check the file's permissions") from None
    except NotARegularFile as e:
        raise BundleProblem(f"{where}: is {e.kind}, not a file", "give the .ref file itself") from None
    except OSError as e:  # a file used as a folder in the path, a link loop, a name too long...
        raise BundleProblem(f"{where}: {e.strerror or e}", "give the .ref file itself") from None
    if len(data) > MAX_FILE_BYTES:
        raise BundleProblem(f"{where}: larger than {MAX_FILE_BYTES // 2**20} MiB; not a reference bundle")
    if data[:2] != b"\x1f\x8b":
        hint = " (an engine trajectory file: bundle it with `tuner reference record`)" if data[:1] == b"{" else ""
        raise BundleProblem(f"{where}: not a tuner reference bundle{hint}",
                            "give a file written by `tuner reference record` or `tuner profile export`")
    try:
        raw = _inflate(data)
    except (EOFError, OSError, zlib.error) as e:
        raise BundleProblem(f"{where}: truncated or damaged ({str(e) or type(e).__name__})",
                            "copy the file again from where it was recorded") from None
    try:
        # NaN and Infinity are not JSON (the hash is over strict JSON); a ValueError also says an integer is over
        # Python's 4,300-digit conversion limit
        doc = json.loads(raw, parse_constant=_not_json)
    except (UnicodeDecodeError, ValueError):
        raise BundleProblem(f"{where}: damaged (its content is not JSON)",
                            "copy the file again from where it was recorded") from None
    except RecursionError:  # arrays nested past the interpreter's limit: no bundle nests so deep
        raise BundleProblem(f"{where}: damaged (its content is nested too deeply)",
                            "copy the file again from where it was recorded") from None
    return _validated(doc, where)


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def _inflate(data: bytes) -> bytes:
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    raw = d.decompress(data, MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise OSError(f"more than {MAX_JSON_BYTES // 2**20} MiB uncompressed")
    if not d.eof:
        raise EOFError("the compressed stream ends early")
    return raw


def _validated(doc: object, where: str) -> Bundle:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleProblem(f"{where}: not a tuner reference bundle",
                            "give a file written by `tuner reference record` or `tuner profile export`")
    version, by = doc.get("version"), doc.get("tuner_version")
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        raise BundleProblem(f"{where}: bundle format version {version!r} (written by tuner {by}); this tuner "
                            f"{__version__} reads version {VERSION}",
                            f"use tuner {by} or newer to screen with it" if newer
                            else "record the reference again with this tuner")
    if doc.get("sha256") != _content_hash(doc):
        raise BundleProblem(f"{where}: its content does not match its hash (edited or damaged)",
                            "copy the file again from where it was recorded, or record a new reference")
    try:
        bundle = fit(doc, Bundle, WORDS, closed=True)
    except Misfit as m:
        at = ".".join(str(p) for p in m.path) or "the document"
        raise BundleProblem(f"{where}: {at}: {m.detail or m.kind}", "record the reference again") from None
    try:
        trajectory = bundle.trajectory_reference()
    except ReferenceProblem as e:
        raise BundleProblem(f"{where}: {e}", "record the reference again") from None
    if trajectory.steps != bundle.recording.steps or not bundle.recording.repeatable:
        raise BundleProblem(f"{where}: its recording is inconsistent ({trajectory.steps} steps in the trajectory, "
                            f"{bundle.recording.steps} recorded, repeatable {bundle.recording.repeatable})",
                            "record the reference again")
    return bundle


def materialize(bundle: Bundle, directory: Path) -> Path:
    """The trajectory as the engine reads it (`--reference`), in `directory` (private to this run)."""
    path = Path(directory) / f"trajectory-{bundle.sha256[:12]}.json"
    save_reference(path, bundle.trajectory_reference())
    os.chmod(path, 0o600)
    return path


# --- beside a profile (docs/screen.md, "Decisions": the reference travels beside the profile, not inside it) ---------


def sidecar_path(profile_path: Path) -> Path:
    """Where a profile's bundled reference lives: beside it, `NAME.ref` for `NAME.toml`."""
    return Path(profile_path).with_suffix(SUFFIX)


def reference_beside(profile_path: Path) -> tuple[Bundle, Path, int] | None:
    """The reference bundled with the profile at `profile_path` (read and checked), its path and size; None when
    there is none. A link there is refused (as the profile store refuses links), a damaged one is a BundleProblem."""
    path = sidecar_path(profile_path)
    if not os.path.lexists(path):
        return None
    if path.is_symlink():
        raise BundleProblem(f"reference {path}: is a symbolic link; the tuner does not follow links beside profiles",
                            "copy the file itself there (cp -L)")
    return read_bundle(path), path, path.stat().st_size


def check_beside(profile_path: Path) -> Path:
    """Where the reference beside the profile at `profile_path` goes, refused (UsageError) when a link is there
    (its target could be any file). Callers that write the profile first ask it before they do."""
    path = sidecar_path(profile_path)
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link; nothing was written", "remove it first")
    return path


def write_beside(bundle: Bundle, profile_path: Path, *, overwrite: bool = False) -> tuple[Path, int]:
    """Store `bundle` beside the profile at `profile_path`; returns its path and size."""
    path = check_beside(profile_path)
    return path, write_bundle(bundle, path, overwrite=overwrite)


def remove_beside(profile_path: Path) -> Path | None:
    """Remove the reference beside a profile (the profile was deleted or replaced); its path, or None."""
    path = sidecar_path(profile_path)
    if not os.path.lexists(path):
        return None
    path.unlink()
    return path


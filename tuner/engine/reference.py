"""The reference-trajectory file: per-step digests of a run at stock settings, and what they depend on.

JSON, written atomically (`tuner.core.atomic.write_atomic`: temp file, fsync, rename):

    {"format": "tuner-engine-reference", "version": 1, "steps": N,
     "fingerprint": {...everything the trajectory depends on...},
     "canary": "<16 hex>" | null,
     "digests": ["<loss bits 8 hex><grad-norm bits 8 hex><parameter bit checksum 16 hex>", ...]}
    (data-parallel ranks: 16 more hex digits, the checksum of the rank's own gradients before the all-reduce)

`digests[i]` belongs to step i + 1. A run may be longer than the reference: it stops comparing past `steps`.

After a replay at stock in a second process (`--verify-repeatable`) the file also holds `"repeatable"` (true or
false), `"first_difference"` (null, or {"step": N, "figure": "loss" | "grad_norm" | "state" | "start-up check: ..."})
and `"replayed_steps"`. A file not yet replayed has `"repeatable": null`.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from tuner.core.atomic import write_atomic
from tuner.core.kernel_files import NotARegularFile, read_regular

FORMAT = "tuner-engine-reference"
VERSION = 1
MAX_FILE_BYTES = 256 * 1024 * 1024  # far above any recording (15 minutes of the tiny preset: ~2 MiB gzipped)


class ReferenceProblem(Exception):
    """The reference file cannot be used with this run (unreadable, or recorded under another config)."""


def f32_bits(x: float) -> int:
    """The IEEE-754 single-precision bits of `x` (exact for values that came from an fp32 tensor)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def step_digest(loss: float, grad_norm: float, param_sum: int | None = None, grad_sum: int | None = None) -> str:
    """Raw loss bits, raw gradient-norm bits (8 hex digits each) and, when given, the 64-bit integer checksum of
    every parameter's bits after the step's update (16 more); data-parallel ranks add the checksum of their own
    gradients before the all-reduce (16 more: a figure only this rank's computation decides).

    >>> step_digest(1.0, 2.0)
    '3f80000040000000'
    >>> step_digest(1.0, 2.0, -1)
    '3f80000040000000ffffffffffffffff'
    >>> step_digest(1.0, 2.0, 0, 1)[32:]
    '0000000000000001'
    """
    head = f"{f32_bits(loss):08x}{f32_bits(grad_norm):08x}"
    if param_sum is None:
        return head
    head += f"{param_sum & 0xFFFFFFFFFFFFFFFF:016x}"
    return head if grad_sum is None else head + f"{grad_sum & 0xFFFFFFFFFFFFFFFF:016x}"


def digest_values(digest: str) -> tuple[float, float]:
    return f32_from_bits(int(digest[:8], 16)), f32_from_bits(int(digest[8:16], 16))


@dataclass
class Reference:
    fingerprint: dict
    digests: list[str] = field(default_factory=list)
    canary: str | None = None
    repeatable: bool | None = None  # None: not replayed yet
    first_difference: dict | None = None
    replayed_steps: int | None = None

    @property
    def steps(self) -> int:
        return len(self.digests)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "steps": self.steps, "fingerprint": self.fingerprint,
                "canary": self.canary, "repeatable": self.repeatable, "first_difference": self.first_difference,
                "replayed_steps": self.replayed_steps, "digests": self.digests}


def save_reference(path: str | os.PathLike, ref: Reference) -> None:
    write_atomic(Path(path), json.dumps(ref.to_json(), separators=(",", ":")).encode(), mode=0o600)


def load_reference(path: str | os.PathLike) -> Reference:
    where = f"--reference {str(path)!r}"
    try:
        data = read_regular(path, MAX_FILE_BYTES)
        if len(data) > MAX_FILE_BYTES:
            raise ReferenceProblem(f"{where}: larger than {MAX_FILE_BYTES // 2**20} MiB; not a reference file")
        doc = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ReferenceProblem(f"{where}: no such file (record one with --record)") from None
    except NotARegularFile as e:
        raise ReferenceProblem(f"{where}: is {e.kind}, not a file (give the reference file itself)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReferenceProblem(f"{where}: unreadable ({e.__class__.__name__})") from None
    return parse_reference(doc, where)


def parse_reference(doc: object, where: str) -> Reference:
    """A reference file's parsed JSON held to its format (the engine's rules, also for a bundled copy: the tuner's
    portable reference, tuner/profiles/reference_bundle.py); `where` names it in the ReferenceProblem."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ReferenceProblem(f"{where}: not a tuner engine reference file")
    if doc.get("version") != VERSION:
        raise ReferenceProblem(f"{where}: version {doc.get('version')!r}, expected {VERSION}")
    digests = doc.get("digests")
    if (not isinstance(digests, list) or doc.get("steps") != len(digests)
            or not all(isinstance(d, str) and len(d) in (16, 32, 48) for d in digests)
            or len({len(d) for d in digests}) > 1):
        raise ReferenceProblem(f"{where}: damaged digest list")
    fp = doc.get("fingerprint")
    if not isinstance(fp, dict):
        raise ReferenceProblem(f"{where}: no fingerprint")
    canary = doc.get("canary")
    repeatable = doc.get("repeatable")
    first = doc.get("first_difference")
    replayed = doc.get("replayed_steps")
    return Reference(fp, digests, canary if isinstance(canary, str) else None,
                     repeatable if isinstance(repeatable, bool) else None, first if isinstance(first, dict) else None,
                     replayed if isinstance(replayed, int) else None)


def mark_repeatability(path: str | os.PathLike, repeatable: bool, first_difference: dict | None,
                       replayed_steps: int) -> None:
    """Record the outcome of a replay in the reference file (atomically)."""
    ref = load_reference(path)
    ref.repeatable, ref.first_difference, ref.replayed_steps = repeatable, first_difference, replayed_steps
    save_reference(path, ref)


def fingerprint_diff(reference: dict, current: dict) -> list[str]:
    """Human-readable differences, e.g. ["seed: reference 0, this run 1"]; empty when they match."""
    return [f"{key}: reference {reference.get(key)!r}, this run {current.get(key)!r}"
            for key in sorted(set(reference) | set(current)) if reference.get(key) != current.get(key)]


MISMATCH = "was recorded under another configuration: "  # the engine's refusal of a reference, before the keys


def differing_keys(reason: str) -> list[str]:
    """The fingerprint keys named in the engine's refusal of a reference (its `end` reason, built from
    `fingerprint_diff` after MISMATCH); empty when the reason is not that refusal.

    >>> differing_keys("--reference 'a' " + MISMATCH + "; ".join(fingerprint_diff({"seed": 0, "x": 1}, {"seed": 1})))
    ['seed', 'x']
    >>> differing_keys("out of memory")
    []
    """
    _, found, rest = reason.partition(MISMATCH)
    if not found:
        return []
    return [part.split(": reference ", 1)[0] for part in rest.split("; ") if ": reference " in part]

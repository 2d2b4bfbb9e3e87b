"""Training text as bytes, and deterministic windows over it.

The embedded default is real text every machine has: the source files of the running Python's standard
library (`*.py` under `sysconfig`'s stdlib, site-packages excluded), read in sorted order. `--data PATH` takes
the user's own file or directory instead. The last 5 % of the bytes are held out; training windows come from
the rest, drawn per step from a generator seeded by (seed, step), so two runs with one seed see identical
batches whatever else happens in between (canaries, idle gaps, extra checks).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
HELDOUT_FRACTION = 0.05
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo"}


class DataProblem(Exception):
    """The data cannot be used (missing, unreadable, too small). A usage error."""


@dataclass
class Corpus:
    data: torch.Tensor  # uint8, CPU
    source: str  # "stdlib" or the user's path
    files: int
    sha256: str

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())


def _walk(root: Path, keep) -> Iterator[Path]:
    """Files under `root` in a stable order (sorted, depth-first), lazily: we stop once we have enough."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        yield from (Path(dirpath) / f for f in sorted(filenames) if keep(f))


def _files(path: str | None) -> Iterator[Path]:
    if path is None:
        return _walk(Path(sysconfig.get_paths()["stdlib"]), lambda f: f.endswith(".py"))
    p = Path(path)
    if p.is_file():
        return iter([p])
    if p.is_dir():
        return _walk(p, lambda f: not f.startswith("."))
    raise DataProblem(f"--data {path!r}: no such file or directory")


def load_corpus(path: str | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES, min_bytes: int = 4096) -> Corpus:
    chunks, total, used = [], 0, 0
    for f in _files(path):
        try:
            blob = f.read_bytes()
        except OSError:
            if path is not None and Path(path).is_file():
                raise DataProblem(f"--data {path!r}: cannot read it") from None
            continue
        if not blob:
            continue
        blob = blob[: max_bytes - total]
        chunks.append(blob)
        total += len(blob)
        used += 1
        if total >= max_bytes:
            break
    raw = b"".join(chunks)
    if len(raw) < min_bytes:
        where = "the standard library sources" if path is None else repr(path)
        raise DataProblem(f"{where}: only {len(raw)} bytes of text, need at least {min_bytes}")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return Corpus(data, "stdlib" if path is None else str(path), used, hashlib.sha256(raw).hexdigest())


class WindowSampler:
    """Batches of (inputs, targets) windows: seeded per step for training, fixed for held-out evaluation."""

    def __init__(self, corpus: Corpus, seq_len: int, seed: int):
        n = corpus.nbytes
        need = 4 * (seq_len + 1)
        split = int(n * (1 - HELDOUT_FRACTION))
        if split < need or n - split < seq_len + 1:
            raise DataProblem(f"{corpus.source}: {n} bytes is too little for windows of {seq_len + 1} bytes")
        self.data, self.seq_len, self.seed, self.split = corpus.data, seq_len, seed, split
        self._arange = torch.arange(seq_len + 1)

    def _windows(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.data[offsets[:, None] + self._arange].long()
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def train_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (2**63))
        offsets = torch.randint(0, self.split - self.seq_len - 1, (batch_size,), generator=g)
        return self._windows(offsets)

    def fixed_batch(self, tag: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch that depends only on `tag` (the canary's), not on the run's seed."""
        g = torch.Generator().manual_seed(0x5EED0000 + tag)
        offsets = torch.randint(0, self.split - self.seq_len - 1, (batch_size,), generator=g)
        return self._windows(offsets)

    def heldout_batch(self, windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`windows` evenly spaced windows from the held-out tail; the same on every run."""
        n = self.data.numel()
        span = n - self.split - self.seq_len - 1
        offsets = torch.tensor([self.split + (span * i) // max(1, windows) for i in range(windows)])
        return self._windows(offsets)

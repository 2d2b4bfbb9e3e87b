"""Training text as bytes (or BPE tokens), and deterministic windows over it.

The embedded default is real text every machine has: the source files of the running Python's standard
library (`*.py` under `sysconfig`'s stdlib, site-packages excluded), read in sorted order. `--data PATH` takes
the user's own file or directory instead. The last 5 % of the bytes are held out; training windows come from
the rest, drawn per step from a generator seeded by (seed, step), so two runs with one seed see identical
batches whatever else happens in between (canaries, idle gaps, extra checks).

Byte-level presets train on the bytes themselves (token = byte); the `nanochat` preset encodes the same text
with a BPE tokenizer learnt on it (`tokenizer.py`) and its windows are windows of tokens.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tuner.engine.tokenizer import BpeTokenizer

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
HELDOUT_FRACTION = 0.05
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo"}


class DataProblem(Exception):
    """The data cannot be used (missing, unreadable, too small). A usage error."""


@dataclass
class Corpus:
    data: torch.Tensor  # the token stream, CPU: uint8 bytes, or int32 BPE token ids once tokenized
    source: str  # "stdlib" or the user's path
    files: int
    sha256: str  # of the raw bytes
    raw: bytes = b""  # the text itself (the tokenizer learns from it)
    tokenizer_sha256: str | None = None  # set once tokenized

    @property
    def nbytes(self) -> int:
        return len(self.raw) if self.raw else int(self.data.numel())

    @property
    def tokens(self) -> int:
        return int(self.data.numel())

    def text(self) -> str:
        return self.raw.decode("utf-8", errors="replace")


def tokenize(corpus: Corpus, tokenizer: BpeTokenizer) -> Corpus:
    """The same corpus as BPE token ids (int32), encoded with `tokenizer`."""
    ids = torch.tensor(tokenizer.encode(corpus.text()), dtype=torch.int32)
    return replace(corpus, data=ids, tokenizer_sha256=tokenizer.sha256)


def _walk(root: Path, keep: Callable[[str], bool]) -> Iterator[Path]:
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
    return Corpus(data, "stdlib" if path is None else str(path), used, hashlib.sha256(raw).hexdigest(), raw)


class WindowSampler:
    """Batches of (inputs, targets) windows: seeded per step for training, fixed for held-out evaluation."""

    def __init__(self, corpus: Corpus, seq_len: int, seed: int) -> None:
        n = corpus.tokens
        need = 4 * (seq_len + 1)
        split = int(n * (1 - HELDOUT_FRACTION))
        if split < need or n - split < seq_len + 1:
            unit = "tokens" if corpus.tokenizer_sha256 else "bytes"
            raise DataProblem(f"{corpus.source}: {n} {unit} is too little for windows of {seq_len + 1} {unit} "
                              f"(the last {HELDOUT_FRACTION:.0%} is held out)")
        self.data, self.seq_len, self.seed, self.split = corpus.data, seq_len, seed, split
        self._arange = torch.arange(seq_len + 1)

    def _windows(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.data[offsets[:, None] + self._arange].long()
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def _random_windows(self, seed: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return self._windows(torch.randint(0, self.split - self.seq_len - 1, (batch_size,), generator=g))

    def train_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._random_windows((self.seed * 1_000_003 + step) % (2**63), batch_size)

    def fixed_batch(self, tag: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch that depends only on `tag` (the canary's), not on the run's seed."""
        return self._random_windows(0x5EED0000 + tag, batch_size)

    def heldout_batch(self, windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`windows` evenly spaced windows from the held-out tail; the same on every run."""
        n = self.data.numel()
        span = n - self.split - self.seq_len - 1
        offsets = torch.tensor([self.split + (span * i) // max(1, windows) for i in range(windows)])
        return self._windows(offsets)

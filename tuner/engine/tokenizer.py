"""A BPE tokenizer trained on the engine's own corpus, the way nanochat trains its own (`nanochat/tokenizer.py`):
`rustbpe` learns the merges with GPT-4's split pattern, `tiktoken` encodes with them. Nothing is downloaded: the
merges come from the corpus, and they are cached under `$XDG_CACHE_HOME/tuner/engine/tokenizer/`, keyed by the
vocabulary size and the corpus's SHA-256, so only the first run on a corpus trains (about 2 s for 4 MiB).

The model's vocabulary is always the preset's (32,768 for `nanochat`): a small corpus may yield fewer merges
than that, and the unused ids simply never occur, as with nanochat's padded vocabulary.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from tuner.core.atomic import write_atomic

if TYPE_CHECKING:
    from tiktoken import Encoding

# GPT-4's split pattern with numbers of 1-2 digits, as nanochat uses (`SPLIT_PATTERN` in nanochat/tokenizer.py).
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s+"""
)
# nanochat's special tokens: they take the last ids of the vocabulary and never occur in the training text.
SPECIAL_TOKENS = (
    "<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
    "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>",
)
CACHE_FORMAT = "tuner-engine-bpe"
CACHE_VERSION = 1
_CHUNK_CHARS = 64 * 1024


class TokenizerProblem(Exception):
    """The tokenizer libraries are missing or the cache is unusable in a way we cannot repair. A setup error."""


@dataclass(frozen=True)
class BpeTokenizer:
    encoding: Encoding
    vocab_size: int  # merges + specials actually learned (<= the model's vocabulary)
    sha256: str  # of the cached file: part of the reference fingerprint
    path: Path
    trained: bool  # True when this process trained it (False: read from the cache)

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def token_bytes(self, vocab: int) -> torch.Tensor:
        """int32 (vocab,): the UTF-8 length of each token (0 for specials and unused ids), for bits per byte."""
        out = torch.zeros(vocab, dtype=torch.int32)
        for i in range(min(vocab, self.encoding.n_vocab)):
            try:
                out[i] = len(self.encoding.decode_single_token_bytes(i))
            except KeyError:
                pass
        first_special = self.vocab_size - len(SPECIAL_TOKENS)  # specials take the ids after the merges
        out[first_special:self.vocab_size] = 0
        return out


def cache_path(cache_root: Path, vocab: int, corpus_sha256: str) -> Path:
    return Path(cache_root) / "engine" / "tokenizer" / f"bpe-{vocab}-{corpus_sha256[:32]}.json"


def _libraries() -> tuple[ModuleType, ModuleType]:
    try:
        import rustbpe
        import tiktoken
    except ImportError as e:  # the nanochat preset needs them; they are project dependencies
        raise TokenizerProblem(f"the nanochat preset needs rustbpe and tiktoken ({e}); reinstall the tuner "
                               "(scripts/setup.sh)") from None
    return rustbpe, tiktoken


def _chunks(text: str) -> Iterator[str]:
    """Line-aligned chunks, so no word is cut in two by the training iterator."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def _encoding(tiktoken: ModuleType, ranks: dict[bytes, int], pattern: str) -> Encoding:
    specials = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="tuner-engine-bpe", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens=specials)


def _read(path: Path, tiktoken: ModuleType, vocab: int, corpus_sha256: str) -> BpeTokenizer | None:
    try:
        blob = path.read_bytes()
        doc = json.loads(blob)
        if (doc.get("format"), doc.get("version"), doc.get("vocab"), doc.get("corpus_sha256")) != (
                CACHE_FORMAT, CACHE_VERSION, vocab, corpus_sha256):
            return None
        ranks = {bytes.fromhex(k): int(v) for k, v in doc["ranks"]}
        enc = _encoding(tiktoken, ranks, doc["pattern"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: train again and overwrite
    return BpeTokenizer(enc, len(ranks) + len(SPECIAL_TOKENS), hashlib.sha256(blob).hexdigest(), path, False)


def load_or_train(text: str, corpus_sha256: str, vocab: int, cache_root: Path,
                  log: Callable[[str], None] = lambda _m: None) -> BpeTokenizer:
    """The tokenizer for this corpus: from the cache when it is there, else trained now and cached."""
    rustbpe, tiktoken = _libraries()
    path = cache_path(cache_root, vocab, corpus_sha256)
    cached = _read(path, tiktoken, vocab, corpus_sha256)
    if cached is not None:
        log(f"tokenizer: {cached.vocab_size:,} tokens from the cache ({path})")
        return cached
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(_chunks(text), vocab - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    pattern = tok.get_pattern()
    ranks = {bytes(k): int(v) for k, v in tok.get_mergeable_ranks()}
    # (hex, rank) tuples, so the sort key is typed int: json writes them as the same arrays, byte for byte
    doc = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "vocab": vocab, "corpus_sha256": corpus_sha256,
           "pattern": pattern, "ranks": sorted(((k.hex(), v) for k, v in ranks.items()), key=lambda kv: kv[1])}
    blob = json.dumps(doc, separators=(",", ":")).encode()
    try:
        write_atomic(path, blob)
    except OSError as e:  # a read-only cache costs a retraining next time, nothing else
        log(f"tokenizer: could not cache it at {path}: {e}")
    log(f"tokenizer: trained {len(ranks) + len(SPECIAL_TOKENS):,} tokens on the corpus, cached at {path}")
    return BpeTokenizer(_encoding(tiktoken, ranks, pattern), len(ranks) + len(SPECIAL_TOKENS),
                        hashlib.sha256(blob).hexdigest(), path, True)

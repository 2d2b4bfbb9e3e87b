"""How many sequences a step takes: halve from the preset's batch until it fits, then (on a GPU) double while
the tokens per step stay within the preset's target and the memory the last probe used says the next one fits.

Pure logic: the runner passes `probe(batch)`, which runs one full training step at that batch (forward,
backward and the optimizer with its temporaries) and returns the peak memory it used in bytes (None where the
device cannot say), or raises an out-of-memory error (`is_oom` tells which errors are).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

HEADROOM_FRACTION = 0.08  # of the device's memory, left free for the allocator's fragmentation and the canary


@dataclass
class BatchFit:
    batch: int
    step_downs: list[str] = field(default_factory=list)  # one line per halving (setup warnings)
    growth: list[str] = field(default_factory=list)  # one line per doubling and why it stopped (logs)


class BatchDoesNotFit(Exception):
    """Batch 1 does not fit."""


def fit_batch(start: int, probe: Callable[[int], int | None], is_oom: Callable[[BaseException], bool],
              on_oom: Callable[[], None], *, seq_len: int, target_tokens: int = 0,
              total_memory_bytes: int | None = None, base_memory_bytes: int = 0) -> BatchFit:
    """`start` halves on out-of-memory until it fits; then, with a `target_tokens`, doubles while
    2 x batch x seq_len <= target_tokens and the predicted peak (base + 2 x (last peak - base)) stays under the
    device's memory less the headroom. A doubling that runs out of memory anyway stops the growth."""
    fit = BatchFit(start)
    batch = start
    while True:
        try:
            peak = probe(batch)
            break
        except Exception as e:
            if not is_oom(e):
                raise
            on_oom()
            if batch == 1:
                raise BatchDoesNotFit("out of memory even at batch 1") from None
            fit.step_downs.append(f"out of memory at batch {batch}; stepped down to {batch // 2}")
            batch //= 2
    grew_from = batch if not fit.step_downs else None  # never grow back after a step-down
    while grew_from is not None and target_tokens and 2 * batch * seq_len <= target_tokens:
        nxt = 2 * batch
        if peak is not None and total_memory_bytes:
            predicted = base_memory_bytes + 2 * max(0, peak - base_memory_bytes)
            limit = total_memory_bytes * (1 - HEADROOM_FRACTION)
            if predicted > limit:
                fit.growth.append(f"batch {nxt} would need about {predicted / 2**30:.1f} GiB of "
                                  f"{limit / 2**30:.1f} GiB usable: staying at {batch}")
                break
        try:
            peak = probe(nxt)
        except Exception as e:
            if not is_oom(e):
                raise
            on_oom()
            fit.growth.append(f"out of memory at batch {nxt}: staying at {batch}")
            break
        fit.growth.append(f"batch {nxt} fits ({nxt * seq_len:,} tokens per step)")
        batch = nxt
    if grew_from is not None and target_tokens and 2 * batch * seq_len > target_tokens and batch > grew_from:
        fit.growth.append(f"reached the target of {target_tokens:,} tokens per step at batch {batch}")
    fit.batch = batch
    return fit

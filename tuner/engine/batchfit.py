"""How many sequences a step takes: halve from the preset's batch until it fits, then (on a GPU) double while
the tokens per step stay within the preset's target and the memory the last probe used says the next one fits.

Pure logic: the runner passes `probe(batch)`, which runs one full training step at that batch (forward,
backward and the optimizer with its temporaries) and returns the peak memory it used in bytes (None where the
device cannot say), or raises an out-of-memory error (`is_oom` tells which errors are). The probes run eager
kernels (one compile per probed batch would cost minutes), which keep more temporaries than the compiled ones the
training runs: the 32,768-wide fp32 logits and their soft cap, several copies eager against one fused pass. So
where the training compiles, the runner also passes `compiled_probe(batch)`, the training's own step, tried once
at the batch the eager probes could not take (the start they stepped down from, or the doubling the growth
stopped short of for memory): without it a card's batch was set by kernels that never train (an H200 stayed at
half nanochat's batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

HEADROOM_FRACTION = 0.08  # of the device's memory, left free for the allocator's fragmentation and the canary

Probe = Callable[[int], "int | None"]


@dataclass
class BatchFit:
    batch: int
    step_downs: list[str] = field(default_factory=list)  # one line per halving (setup warnings)
    growth: list[str] = field(default_factory=list)  # one line per doubling and why it stopped (logs)
    compiled_fit: bool = False  # the batch was taken by the compiled probe (the eager ones could not)


class BatchDoesNotFit(Exception):
    """`batch` does not fit: batch 1, or a fixed batch (`step_down=False`)."""

    def __init__(self, batch: int):
        super().__init__(f"out of memory at batch {batch}")
        self.batch = batch


def fit_batch(start: int, probe: Probe, is_oom: Callable[[BaseException], bool], on_oom: Callable[[], None], *,
              seq_len: int, target_tokens: int = 0, total_memory_bytes: int | None = None,
              base_memory_bytes: int = 0, compiled_probe: Probe | None = None, step_down: bool = True) -> BatchFit:
    """`start` halves on out-of-memory until it fits (with `step_down`; without, BatchDoesNotFit); then, with a
    `target_tokens`, doubles while 2 x batch x seq_len <= target_tokens and the predicted peak
    (base + 2 x (last peak - base)) stays under the device's memory less the headroom. A doubling that runs out of
    memory anyway stops the growth. `compiled_probe` gets one try, at the first batch the eager probes refuse."""
    fit = BatchFit(start)
    limit = None if not total_memory_bytes else total_memory_bytes * (1 - HEADROOM_FRACTION)

    def attempt(run: Probe, batch: int) -> tuple[bool, int | None]:
        """(fits, peak): an out-of-memory error is a no, after `on_oom`; any other error is raised."""
        try:
            return True, run(batch)
        except Exception as e:
            if not is_oom(e):
                raise
            on_oom()
            return False, None

    def compiled_takes(batch: int) -> bool:
        """The one try of the compiled probe: it runs, with the headroom left."""
        nonlocal compiled_probe
        run, compiled_probe = compiled_probe, None
        if run is None:
            return False
        fits, peak = attempt(run, batch)
        if fits and peak is not None and limit is not None and peak > limit:
            fit.growth.append(f"batch {batch} ran compiled at {peak / 2**30:.1f} GiB, over the "
                              f"{limit / 2**30:.1f} GiB usable")
            return False
        if fits:
            fit.compiled_fit = True
            fit.growth.append(f"batch {batch} fits with the compiled kernels the training runs "
                              f"({batch * seq_len:,} tokens per step; the eager probes could not take it)")
        else:
            fit.growth.append(f"out of memory at batch {batch} with the compiled kernels too")
        return fits

    batch = start
    while True:
        fits, peak = attempt(probe, batch)
        if fits:
            break
        if batch == start and compiled_takes(batch):
            fit.batch = batch
            return fit
        if batch == 1 or not step_down:
            raise BatchDoesNotFit(batch) from None
        fit.step_downs.append(f"out of memory at batch {batch}; stepped down to {batch // 2}")
        batch //= 2
    grew_from = batch if not fit.step_downs else None  # never grow back after a step-down

    def stopped_for_memory(nxt: int, reason: str) -> bool:
        """The growth stops at `batch` for `reason`, unless the compiled probe takes `nxt`."""
        if compiled_probe is None:
            fit.growth.append(f"{reason}: staying at {batch}")
            return False
        fit.growth.append(f"{reason} with eager kernels")
        if compiled_takes(nxt):
            return True
        fit.growth.append(f"staying at {batch}")
        return False

    while grew_from is not None and target_tokens and 2 * batch * seq_len <= target_tokens:
        nxt = 2 * batch
        if peak is not None and limit is not None:
            predicted = base_memory_bytes + 2 * max(0, peak - base_memory_bytes)
            if predicted > limit:
                if stopped_for_memory(nxt, f"batch {nxt} would need about {predicted / 2**30:.1f} GiB of "
                                           f"{limit / 2**30:.1f} GiB usable"):
                    batch = nxt
                break
        fits, peak = attempt(probe, nxt)
        if not fits:
            if stopped_for_memory(nxt, f"out of memory at batch {nxt}"):
                batch = nxt
            break
        fit.growth.append(f"batch {nxt} fits ({nxt * seq_len:,} tokens per step)")
        batch = nxt
    if grew_from is not None and target_tokens and 2 * batch * seq_len > target_tokens and batch > grew_from:
        fit.growth.append(f"reached the target of {target_tokens:,} tokens per step at batch {batch}")
    fit.batch = batch
    return fit

"""Data-parallel ranks (`--world-size N --rank R --rendezvous URL`): one engine per device, gradients all-reduced
every step, so the traffic between the devices is part of the load (issue 16, the whole-rig confirmation).

Each rank is its own engine process on its own device, with its own detectors and its own reference file. What
they share: the initial weights (same seed), the averaged gradients (one all-reduce per step, summed then divided
by N: a fixed reduction, so a replay at stock repeats bit for bit on every rank), and a small control vector per
step (`agree`: stop when any rank reached its bound; rank 0's mixed-mode phase), so every rank makes the same
number of steps and idles at the same time. The data differ per rank (rank-seeded windows) but are deterministic.

A collective that fails or times out (`--collective-timeout-s`) means a peer died or stalled: `PeerLost`, which
the engine reports as `error`/`peer` (not this rank's fault: the host calls it inconclusive). A group that never
forms is a setup error. Backends: gloo on the CPU (simulated cards), nccl on CUDA (RCCL under the same name on
ROCm builds of torch).
"""

from __future__ import annotations

import datetime
import os
import re
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


class PeerLost(Exception):
    """A collective failed or timed out: another rank died or stalled (not a fault of this rank)."""


class GroupDidNotForm(Exception):
    """The process group never formed (a rank missing, a bad rendezvous): a setup problem."""


def collective_library(backend: str) -> str:
    """What the ranks actually used, for the profile: gloo, nccl or rccl."""
    if backend == "nccl" and getattr(torch.version, "hip", None):
        return "rccl"
    return backend


class DataParallel:
    """The process group of one rank. `state` is called with "collective" while this rank waits in a collective
    (the engine's heartbeat reports it, so the client's watchdog does not take a wait for a peer as a hang)."""

    def __init__(self, world_size: int, rank: int, rendezvous: str, timeout_s: float, device: torch.device,
                 device_type: str, *, set_state: Callable[[str | None], None] | None = None) -> None:
        self.world_size, self.rank, self.rendezvous, self.timeout_s = world_size, rank, rendezvous, timeout_s
        # gloo on the CPU, nccl on CUDA and ROCm (torch's ROCm build maps the nccl backend to RCCL)
        self.device, self.backend = device, "nccl" if device_type == "cuda" else "gloo"
        self._set_state = set_state or (lambda state: None)
        self.collective_s = 0.0  # time spent in collectives (the all-reduce share of a step)
        self.collectives = 0
        self._formed = False

    @property
    def library(self) -> str:
        return collective_library(self.backend)

    def _tensor_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def init(self) -> None:
        if self.backend == "nccl":
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # a timed-out collective raises, not aborts
            torch.cuda.set_device(self.device)
        self._set_state("collective")
        try:
            dist.init_process_group(self.backend, init_method=self.rendezvous, world_size=self.world_size,
                                    rank=self.rank, timeout=datetime.timedelta(seconds=self.timeout_s))
            self._formed = True
            self._collective(lambda: dist.barrier())
        except PeerLost as e:
            raise GroupDidNotForm(f"the data-parallel group ({self.world_size} ranks, {self.backend}) did not form "
                                  f"within {self.timeout_s:g} s: {e}") from None
        except (RuntimeError, ValueError) as e:
            raise GroupDidNotForm(f"the data-parallel group ({self.world_size} ranks, {self.backend}, rendezvous "
                                  f"{self.rendezvous}) did not form within {self.timeout_s:g} s: "
                                  f"{_first_line(e)}") from None
        finally:
            self._set_state(None)

    def _collective(self, call: Callable[[], object]) -> None:
        self._set_state("collective")
        t0 = time.perf_counter()
        try:
            call()
        except RuntimeError as e:  # gloo: "Connection closed by peer", "Timed out waiting ...", NCCL: watchdog
            raise PeerLost(f"a collective failed after {time.perf_counter() - t0:.1f} s (a peer rank died or "
                           f"stalled; timeout {self.timeout_s:g} s): {_first_line(e)}") from None
        finally:
            self.collective_s += time.perf_counter() - t0
            self.collectives += 1
            self._set_state(None)

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Average the gradients over the ranks: one flat fp32 buffer per call, summed by the backend (a fixed
        reduction order for a fixed group), divided by N, copied back. Every rank ends with the same bits."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        if flat.device != self._tensor_device():
            flat = flat.to(self._tensor_device())
        self._collective(lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM))
        flat.div_(self.world_size)
        for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(part.view_as(g))

    def agree(self, values: list[int]) -> list[int]:
        """The element-wise maximum of `values` over the ranks (a rank sends 0 where it has nothing to say)."""
        t = torch.tensor(values, dtype=torch.int64, device=self._tensor_device())
        self._collective(lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
        return [int(v) for v in t.tolist()]

    def close(self) -> None:
        """Leave the group. After a peer was lost, only this process's side is torn down (never waits on it)."""
        if self._formed and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - leaving a broken group must not hide the run's verdict
                pass
        self._formed = False


def data_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s training windows: rank 0 trains on what a single-device run would, the others on
    their own shard (distinct, deterministic)."""
    return seed if rank == 0 else seed + 1_000_003 * rank


_SOURCE_LOCATION = re.compile(r"^\[[^\]]*\.(?:cc|cpp|c|h|hpp):\d+\]\s*")  # gloo/c10: "[/…/pair.cc:534] "


def _first_line(e: BaseException) -> str:
    """The error's first line without the C++ source location gloo and c10 put in front: what a user reads is
    "Connection closed by peer [127.0.0.1]:4711", not the path of torch's build tree.

    >>> _first_line(RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
    ...                          "closed by peer [127.0.0.1]:4711"))
    'Connection closed by peer [127.0.0.1]:4711'
    """
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return (_SOURCE_LOCATION.sub("", line) or line)[:300]

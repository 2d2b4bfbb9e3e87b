"""The backend interface: the only way the rest of the tuner reaches a GPU.

A backend owns one vendor's devices. Every write goes validate -> apply -> read back -> verify; a backend raises
a typed `TunerError` (with a one-line remedy) instead of returning a status.
"""

from __future__ import annotations

import contextlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tuner.core.card_lock import CardLock
from tuner.core.errors import UnknownDevice, Unsupported, UsageError
from tuner.core.models import Capabilities, DeviceInfo, ErrorCounters, Knob, StressTarget, Telemetry

#: a kernel-log source for `tuner.tuning.kernel_log.KernelLogWatcher`: its lines and how to stop reading them
KernelLogSource = tuple[Iterable[str], Callable[[], None]]


def warn_on_stderr(message: str) -> None:
    """A backend's warnings when its caller routes them nowhere else: one `tuner: warning:` line on stderr."""
    print(f"tuner: warning: {message}", file=sys.stderr)


def check_lock_mhz(mhz: int, lo: int, hi: int) -> None:
    """`--lock-mhz`: a whole number of MHz within the card's clocks `lo`..`hi`, else UsageError."""
    if isinstance(mhz, bool) or not isinstance(mhz, int) or not lo <= mhz <= hi:
        raise UsageError(f"--lock-mhz {mhz} is outside this card's clocks {lo}..{hi} MHz",
                         f"pick a clock between {lo} and {hi} MHz")


def no_lock_clock() -> UsageError:
    """`--lock-mhz` on a card without a locked max clock (AMD): the one refusal, whoever meets it."""
    return UsageError("--lock-mhz applies only to NVIDIA cards", "drop --lock-mhz")


class Backend(ABC):
    """One vendor's GPUs (or the simulated ones).

    Besides the cards, a backend says where the machine's safety state lives (docs/helper.md, "The safety state
    through the backend"): the one-writer hold (`claim`/`release`), the open trial (`trial_begin`/`trial_end`, a
    hard failure marked on the way out), the unsafe list (`unsafe_entries`/`unsafe_clear`), trials recovered after
    a death (`recovered_trials`) and the kernel log (`kernel_log_source`). In-process (this base class) the tuner's
    own files are that state: the hold is the per-user `CardLock`, the journal (tuner.tuning.journal) records the
    trial and the unsafe list in `$XDG_STATE_HOME`, and there is no list beyond it. The root helper's client
    (`HelperBackend`) answers from the helper's machine-wide state instead, which every user of the machine shares.
    The journal asks these methods and applies the one rule (tuner.core.unsafe_rule) to what they return."""

    #: short name shown in `tuner list` and the doctor: "amd", "nvidia", "simulated"
    name: str = "base"
    simulated: bool = False

    @abstractmethod
    def devices(self) -> list[DeviceInfo]:
        """Every device this backend drives, in a stable order."""

    def device(self, device_id: str) -> DeviceInfo:
        for dev in self.devices():
            if dev.id == device_id:
                return dev
        known = ", ".join(d.id for d in self.devices()) or "none"
        raise UnknownDevice(f"no device {device_id!r}", f"known devices: {known} (see `tuner list`)")

    @abstractmethod
    def knob(self, device_id: str) -> Knob:
        """The undervolt knob with its current value and the device's real range."""

    @abstractmethod
    def telemetry(self, device_id: str) -> Telemetry:
        """One sample; fields the device does not report are None."""

    @abstractmethod
    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        """Validate `value` against the knob, write it, read it back and verify.

        Raises OutOfRange (nothing written), PermissionDenied, Unsupported, NotApplied (the previous value was
        restored) or DeviceLost. Returns the knob as read back.
        """

    @abstractmethod
    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        """Return the device to stock and verify it; returns the knob as read back. `force` (`tuner reset
        --force`): also when another writer holds the card. In-process the caller has already decided that (the
        card lock); through the root helper it is the helper that holds the writer and must be told."""

    def revert(self, device_id: str, value: int) -> Knob:
        """Put back what the card held before the unconfirmed change in progress, whose knob read `value` then
        (keep-or-revert, the helper's lease). It is what the card held, not a request: never refused as a new
        overvolt. Here the knob is the whole state, so the value is written back; NvidiaBackend also puts back each
        performance state's own offset and the lock (or none) it found. A stock value goes back as a reset."""
        if value == self.knob(device_id).stock:
            return self.reset(device_id)
        return self.apply(device_id, value, allow_overvolt=True)

    def found_state(self, device_id: str) -> dict[str, Any] | None:
        """What `revert` puts back beyond the knob's value (NVIDIA: each performance state's offset and the lock),
        found by the change in progress, or what the next write would find when none is: plain JSON data for a record
        that outlives this process (the root helper's writes journal), given back by `adopt_found`. None: the
        knob's value is the whole state."""
        return None

    def adopt_found(self, device_id: str, found: dict[str, Any]) -> bool:
        """The unconfirmed change on the card is a dead process's that found `found` (`found_state`'s): the next
        `revert` puts that back. False where it does not fit this card (the value goes back as it always did)."""
        return False

    def keep(self, device_id: str) -> None:  # noqa: B027 - optional hook
        """The value now on the card is confirmed (kept): a backend that puts unconfirmed writes back (the root
        helper's client) stops doing so. Writes in-process stay until changed, so this does nothing here."""

    @abstractmethod
    def capabilities(self, device_id: str) -> Capabilities:
        """What this device supports through this backend."""

    @abstractmethod
    def stress_target(self, device_id: str) -> StressTarget:
        """How the stress engine reaches this device (and, on simulated cards, which faults to inject)."""

    def note_load(self, device_id: str, active: bool) -> None:  # noqa: B027 - optional hook
        """Told when a stress run starts or stops on a device. Real cards measure load; the simulator needs it."""

    def error_counters(self, device_id: str) -> ErrorCounters:
        """The card's hardware error counters (ECC, RAS), read-only; none, with why, where this backend has none."""
        self.device(device_id)
        return ErrorCounters(why=f"the {self.name} backend reads no hardware error counters")

    def foreign_state(self, device_id: str) -> str | None:
        """A one-line description of a setting on the card that the tuner did not apply (another tool's offset),
        or None. A bisect refuses such a card: it must start from a known state."""
        return None

    def applied_pstates(self, device_id: str) -> tuple[int, ...] | None:
        """NVIDIA: the performance states an applied offset covers; None where the notion does not apply."""
        return None

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        """NVIDIA: the max graphics clock the next `apply` locks to (`--lock-mhz`); a backend without a locked
        clock (AMD) refuses with UsageError, nothing written."""
        raise no_lock_clock()

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        """NVIDIA: lock future applies at the clock measured under the stock baseline; returns the lock chosen,
        or None where the knob has no locked clock."""
        return None

    def persistence_off(self, device_id: str) -> bool:
        """NVIDIA: True when the card's persistence mode reads off (a headless driver then drops every setting when
        its last client exits). False where it reads on, cannot be read, or the card has no such mode."""
        return False

    def enable_persistence(self, device_id: str) -> None:
        """NVIDIA: turn persistence mode on and read it back (NvidiaBackend); raises Unsupported, PermissionDenied
        or NotApplied, nothing else written. A card without such a mode: Unsupported."""
        raise Unsupported(f"{device_id} has no persistence mode to turn on through the {self.name} backend")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release libraries (NVML shutdown and the like)."""

    # --- the safety state (in-process: the tuner's own files; HelperBackend: the helper's machine-wide state) ----
    def claim(self, device_id: str, purpose: str = "") -> None:
        """Hold `device_id` as its one writer until `release` (a bisect holds it across all its trials): CardBusy,
        naming the holder, when someone else holds it (another job of this tuner too). In-process: the per-user
        card lock (tuner.core.card_lock)."""
        lock = CardLock(device_id, purpose or None).acquire()  # CardBusy when held, in this process too
        self.__dict__.setdefault("_claims", {})[device_id] = lock

    def release(self, device_id: str) -> None:
        lock = self.__dict__.get("_claims", {}).pop(device_id, None)
        if lock is not None:
            lock.release()

    @contextlib.contextmanager
    def holding(self, device_id: str, purpose: str = "") -> Iterator[None]:
        """`claim` for the duration of a `with` block, released however it ends."""
        self.claim(device_id, purpose)
        try:
            yield
        finally:
            self.release(device_id)

    def trial_begin(self, device_id: str, setting: int, phase: str,  # noqa: B027 - in-process: nothing more
                    session: str | None = None) -> None:
        """A trial at `setting` is about to touch the card. In-process the journal's own file is the record (it is
        written before this is called), so there is nothing more to do."""

    def trial_end(self, device_id: str, unsafe: Any = None) -> None:  # noqa: B027 - in-process: nothing more
        """The card's trial is over (the card at stock); `unsafe` (a `tuner.helper.schema.UnsafeMark`): it failed
        hard, and the setting goes on the unsafe list. In-process the journal appends it to its own list."""

    def unsafe_entries(self, device_id: str) -> list[dict[str, Any]]:
        """The unsafe entries kept beyond the tuner's own list (tuner.tuning.journal's): in-process, none."""
        return []

    def unsafe_clear(self, device_id: str, setting: int | None = None) -> list[dict[str, Any]]:
        """Remove entries (all, or those for `setting`) from the list kept beyond the tuner's own; what went."""
        return []

    def recovered_trials(self, device_id: str) -> list[Any]:
        """Trials the keeper of the machine's state closed after their client or itself died (the root helper's
        `tuner.helper.schema.RecoveredTrial`); in-process the journal's own open trial tells it, so none."""
        return []

    def kernel_log_source(self, device_ids: list[str]) -> KernelLogSource | None:
        """Where a trial's kernel-log watcher reads; None: from `/dev/kmsg` itself (in-process)."""
        return None

    def former_serials(self, device_id: str) -> tuple[str, ...]:
        """Serials an older version knew this card by (the root helper's lists kept under them stay this card's)."""
        return ()


class ForwardingBackend(Backend):
    """A backend that hands each card's calls to the backend that drives it (`_to`): `CompositeBackend` routes by
    device id, `tuner.backends.helper_client.ReadOnlyBackend` wraps one and refuses its writes."""

    @abstractmethod
    def _to(self, device_id: str) -> Backend:
        """The backend that drives `device_id`."""

    def knob(self, device_id: str) -> Knob:
        return self._to(device_id).knob(device_id)

    def telemetry(self, device_id: str) -> Telemetry:
        return self._to(device_id).telemetry(device_id)

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        return self._to(device_id).apply(device_id, value, allow_overvolt=allow_overvolt)

    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        return self._to(device_id).reset(device_id, force=force)

    def revert(self, device_id: str, value: int) -> Knob:
        return self._to(device_id).revert(device_id, value)

    def found_state(self, device_id: str) -> dict[str, Any] | None:
        return self._to(device_id).found_state(device_id)

    def adopt_found(self, device_id: str, found: dict[str, Any]) -> bool:
        return self._to(device_id).adopt_found(device_id, found)

    def keep(self, device_id: str) -> None:
        self._to(device_id).keep(device_id)

    def capabilities(self, device_id: str) -> Capabilities:
        return self._to(device_id).capabilities(device_id)

    def stress_target(self, device_id: str) -> StressTarget:
        return self._to(device_id).stress_target(device_id)

    def note_load(self, device_id: str, active: bool) -> None:
        self._to(device_id).note_load(device_id, active)

    def error_counters(self, device_id: str) -> ErrorCounters:
        return self._to(device_id).error_counters(device_id)

    def foreign_state(self, device_id: str) -> str | None:
        return self._to(device_id).foreign_state(device_id)

    def former_serials(self, device_id: str) -> tuple[str, ...]:
        return self._to(device_id).former_serials(device_id)

    def applied_pstates(self, device_id: str) -> tuple[int, ...] | None:
        return self._to(device_id).applied_pstates(device_id)

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        self._to(device_id).set_lock_clock(device_id, mhz)

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        return self._to(device_id).lock_at_measured_clock(device_id, clock_mhz)

    def persistence_off(self, device_id: str) -> bool:
        return self._to(device_id).persistence_off(device_id)

    def enable_persistence(self, device_id: str) -> None:
        self._to(device_id).enable_persistence(device_id)


class CompositeBackend(ForwardingBackend):
    """Several vendors' backends behind one, routing by device id (a box can hold AMD and NVIDIA cards)."""

    name = "composite"

    def __init__(self, backends: list[Backend]):
        self.backends = backends

    def _to(self, device_id: str) -> Backend:
        for backend in self.backends:
            if any(d.id == device_id for d in backend.devices()):
                return backend
        self.device(device_id)  # raises UnknownDevice with the list of known ids
        raise AssertionError("unreachable")

    def devices(self) -> list[DeviceInfo]:
        return [d for b in self.backends for d in b.devices()]

    def close(self) -> None:
        for backend in self.backends:
            backend.close()

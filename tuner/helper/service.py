"""What the root helper does with each request: re-check it, write, journal, keep or put back.

The helper trusts no request. Before any write to a card it re-checks, whatever the client checked already:

1. the card exists (by id; a request never names a path);
2. the safety state of the card validates (a damaged unsafe list, trial or writes journal: refused, fail closed);
3. one writer per card (`leases.Book`): another connection's hold is `busy`, with its uid, pid and command;
4. the value: the device's real range and step (`Knob.validate`, from `OD_RANGE` or NVML's limits, as the backend
   reads them) and no overvolt unless the request asks *and* the helper was started with `--allow-overvolt`;
5. the machine's unsafe list (`core.unsafe_rule`): nothing at or beyond a setting that failed hard;

then it journals the change durably (`state.writes`), writes it through the backend (which validates, writes,
reads back and restores the previous value on a mismatch) and logs it with the caller's uid. An unconfirmed
change goes back (the previous value, else stock) when its lease runs out, when its connection closes and when
the helper is stopped. Everything happens under one lock: the cards have one writer, the helper.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner import __version__
from tuner.backends.base import Backend, no_lock_clock
from tuner.core import exit_codes
from tuner.core.errors import PermissionDenied, TunerError, UnknownDevice, Unsupported
from tuner.core.kernel_files import boot_id as current_boot_id
from tuner.core.kernel_files import same_boot
from tuner.core.models import DeviceInfo, Knob, printable
from tuner.core.unsafe_rule import blocking_setting
from tuner.helper import schema as s
from tuner.helper.leases import Book, Pending
from tuner.helper.peer import Peer
from tuner.helper.state import MAX_IMPORTED_LIST_BYTES, MachineState, Write, card_key, older_keys
from tuner.helper.user_import import read_user_state

DEFAULT_LEASE_S = 10.0  # a lock-clock choice's lease (a set names its own)


class Refused(TunerError):
    """A request the helper refuses with a code of its own (`schema.CODES`)."""

    def __init__(self, code: str, message: str, remedy: str | None = None):
        super().__init__(message, remedy)
        self.code = code


@dataclass
class Client:
    """One connection, as the service knows it."""

    conn: int
    peer: Peer


class HelperService:
    def __init__(self, backend: Backend, state: MachineState, *, group: str, allow_overvolt: bool = False,
                 sim: s.SimConfig | None = None, log: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.backend, self.state = backend, state
        self.group, self.allow_overvolt, self.sim = group, allow_overvolt, sim
        self._log = log or (lambda line: print(f"tuner-helper: {line}", file=sys.stderr, flush=True))
        self.clock = clock
        self.lock = threading.RLock()
        self.book = Book()
        self.lost: dict[int, list[s.LostChange]] = {}
        # connection -> card -> its open trial a forced reset ended: its own trial_end is then answered as done, and
        # its hard-failure mark still recorded (evidence of that trial's setting)
        self.ended: dict[int, dict[str, s.OpenTrial]] = {}
        self.stopped = False  # `shutdown` ran: the process exits, so nothing it could not put back is done
        self.devices: dict[str, DeviceInfo] = {d.id: d for d in backend.devices()}
        self.keys = {card: card_key(d) for card, d in self.devices.items()}

    # --- helpers ------------------------------------------------------------------------------------------------
    def _writer(self, card: str, who: Client) -> str:
        """The card's key, after the checks every write makes first (`handle` has checked the card exists): its
        state validates, no one else holds it."""
        key = self.keys[card]
        self.state.check(key)
        self.book.check_writer(card, who.conn, who.peer)
        return key

    def _audit(self, event: str, card: str, who: Client, **fields: object) -> None:
        self.state.log(event, card=card, uid=who.peer.uid, pid=who.peer.pid, command=who.peer.command, **fields)
        detail = " ".join(f"{k}={v}" for k, v in fields.items())
        self._log(f"{event} {card} {detail} by uid {who.peer.uid} (pid {who.peer.pid}: {who.peer.command})")

    def _write_record(self, pending: Pending, who: Client) -> Write:
        return Write(card=pending.card, key=pending.key, previous=pending.previous,
                     previous_lock_mhz=pending.previous_lock_mhz, value=pending.setting, uid=who.peer.uid,
                     pid=who.peer.pid, helper_pid=os.getpid(), boot_id=current_boot_id(), since=time.time(),
                     found=self.backend.found_state(pending.card))

    def _pending_for(self, card: str, key: str, who: Client, knob: Knob, lease_s: float) -> Pending:
        """This connection's unconfirmed change of the card (which it now holds), started now if it has none."""
        self.book.hold(card, who.conn, who.peer, time.time())
        pending = self.book.pending.get(card)
        if pending is None or pending.conn != who.conn:
            pending = Pending(who.conn, card, key, knob.current, None, None, lease_s, self.clock() + lease_s)
            self.book.pending[card] = pending
        pending.lease_s = lease_s
        pending.deadline = self.clock() + lease_s
        return pending

    def _journal(self, pending: Pending, who: Client, before: Pending | None) -> None:
        """Journal `pending` durably, before the card is touched. When that fails nothing was written, so the book
        goes back to `before` (this connection's change as it was before the request, or none): a change left
        pending that was never made would be put back over the card as found (NVIDIA: a reset wiping P2's offset)."""
        try:
            self.state.set_write(pending.key, self._write_record(pending, who))
        except BaseException:
            if before is None:
                self.book.pending.pop(pending.card, None)
                self.book.release_if_idle(pending.card, who.conn)
            else:
                self.book.pending[pending.card] = before
            raise

    def _settle(self, card: str, conn: int) -> None:
        """The card has nothing unconfirmed any more: forget the change, its journal entry, `conn`'s idle hold."""
        self.book.pending.pop(card, None)
        self.state.set_write(self.keys[card], None)
        self.book.release_if_idle(card, conn)

    # --- requests -----------------------------------------------------------------------------------------------
    def handle(self, who: Client, request: s.Request) -> object:
        """The result of `request` (a schema struct or a core dataclass), or a TunerError."""
        handler = getattr(self, f"_op_{s.op_of(request)}")
        if isinstance(request, s.Hello):
            # it reads the caller's home, which may never answer (a hung NFS mount, the user's own FUSE file
            # system): without the lock, which `import_user` takes only to merge
            return handler(who, request)
        with self.lock:
            if self.stopped:  # a connection's thread outlives `shutdown` until the process exits
                raise Refused("idle", "tuner-helper is stopping; nothing was changed",
                              "run the command again once tuner-helper is back")
            if isinstance(request, s.CardRequest) and request.card not in self.devices:
                raise UnknownDevice(f"no card {request.card!r}", f"known cards: {', '.join(self.devices) or 'none'}")
            return handler(who, request)

    def _op_hello(self, who: Client, r: s.Hello) -> s.HelloResult:
        if r.version != s.PROTOCOL_VERSION:
            raise Refused("version", f"this helper speaks protocol {s.PROTOCOL_VERSION}, the client {r.version}",
                          "use a tuner of the same version as tuner-helper")
        self.import_user(who.peer.uid)
        return s.HelloResult(s.PROTOCOL_VERSION, __version__, self.backend.name, self.backend.simulated, self.sim,
                             self.group, who.peer.uid, self.allow_overvolt)

    def _op_list(self, who: Client, r: s.ListCards) -> list[s.CardEntry]:
        entries = []
        for card, device in self.devices.items():
            try:
                entries.append(s.CardEntry(device, self.backend.capabilities(card), self.keys[card]))
            except TunerError as e:
                entries.append(s.CardEntry(device, None, self.keys[card], e.one_line()))
        return entries

    def _op_read_knob(self, who: Client, r: s.ReadKnob) -> Knob:
        return self.backend.knob(r.card)

    def _op_read_telemetry(self, who: Client, r: s.ReadTelemetry) -> object:
        return self.backend.telemetry(r.card)

    def _op_read_target(self, who: Client, r: s.ReadTarget) -> object:
        return self.backend.stress_target(r.card)

    def _op_read_state(self, who: Client, r: s.ReadState) -> s.CardState:
        return s.CardState(self.backend.foreign_state(r.card), self.backend.applied_pstates(r.card))

    def _op_set(self, who: Client, r: s.Set) -> Knob:
        had = self.book.pending.get(r.card)
        if r.revert and (had is None or had.conn != who.conn):
            # nothing of this connection's is pending there: its lease or a forced reset put it back already, and
            # a write now would be a new setting over that (a stock value: a reset, wiping NVIDIA's P2 offset)
            return self.backend.knob(r.card)
        # the client's revert (marked on the wire) of the value this connection's unconfirmed change found: put back
        # the state it found, as the lease would; a plain set at that value is a new setting (NVIDIA: every pstate,
        # locked), which its confirm keeps
        reverting = r.revert and had is not None and had.conn == who.conn and r.value == had.previous
        key = self._writer(r.card, who)
        knob = self.backend.knob(r.card)
        # what the card held is no new overvolt (Backend.revert; the lease puts it back all the same)
        if r.allow_overvolt and knob.is_overvolt(r.value) and not self.allow_overvolt and not reverting:
            raise Refused("overvolt-not-allowed", f"{r.value:+d} {knob.unit} is an overvolt, and this helper does "
                          "not allow overvolting", "start tuner-helper with --allow-overvolt if you really mean it")
        knob.validate(r.value, allow_overvolt=r.allow_overvolt)
        entries = [e for e in self.state.unsafe_entries(key) if e.unit == knob.unit]
        worst = blocking_setting(knob, r.value, [e.setting for e in entries])
        if worst is not None:
            entry = next(e for e in reversed(entries) if e.setting == worst)
            raise Refused("unsafe", f"{r.value:+d} {knob.unit} is at or beyond {worst:+d} {knob.unit}, which failed "
                          f"hard on this card ({entry.kind}: {entry.reason or 'no reason recorded'}; machine list)",
                          "choose a less aggressive value; `tuner unsafe clear` removes the entry if you are sure")
        before = dataclasses.replace(had) if had is not None else None
        pending = self._pending_for(r.card, key, who, knob, r.lease_s)
        was = pending.value  # this connection's earlier unconfirmed value (None: only its lock clock, or none)
        pending.value = r.value
        self._journal(pending, who, before)
        try:
            if reverting:
                applied = self.backend.revert(r.card, r.value)
            else:
                applied = self.backend.apply(r.card, r.value, allow_overvolt=r.allow_overvolt)
        except BaseException:
            # nothing pending once the card reads the previous value again; the backend's own put-back can fail too
            # (NotApplied "restoring ... also failed", an unreadable card), and then the lease still puts it back
            with contextlib.suppress(TunerError):
                current = self.backend.knob(r.card).current
                if had is None or had.conn != who.conn:
                    if current == pending.previous:
                        self._settle(r.card, who.conn)
                elif current == (pending.previous if was is None else was):
                    # the backend put this connection's earlier change back: the record and the audit log name
                    # what the card holds, not the value it refused
                    pending.value = was
                    self.state.set_write(key, self._write_record(pending, who))
            raise
        if applied.current != pending.value and not reverting:
            # the driver snapped the offset (NVIDIA, LACT issue #1202): the record and the audit line name what the
            # card holds, not the value asked for; a record left at the request only misnames it (what goes back is
            # `previous`), so a failure to rewrite it does not fail a write that was made
            pending.value = applied.current
            with contextlib.suppress(TunerError):
                self.state.set_write(key, self._write_record(pending, who))
        self._audit("set", r.card, who, value=pending.value, unit=knob.unit, lease_s=r.lease_s)
        if reverting and applied.current == pending.previous:
            # back as found; the lock clock choice too (keep_or_revert sets it back first: this is the same choice),
            # and then nothing is left to put back: a second revert at the lease's end would find no state of the
            # change's and put the value back over it (NVIDIA: a reset wiping P2's offset, or P0's spread and locked)
            try:
                if pending.previous_lock_mhz is not None:
                    self.backend.set_lock_clock(r.card, pending.previous_lock_mhz)
            except TunerError:
                pass  # the choice could not be set back: the change stays, and its lease puts it back
            else:
                self._settle(r.card, who.conn)
        # a new Set that reads the previous value is still a change (NVIDIA: it locks the clock and writes every
        # pstate), put back unless confirmed
        return applied

    def _op_confirm(self, who: Client, r: s.Confirm) -> None:
        pending = self.book.pending.get(r.card)
        if pending is None or pending.conn != who.conn:
            raise Refused("usage", f"nothing of this connection to confirm on {r.card}",
                          "confirm after a set, before its lease runs out")
        self._audit("confirm", r.card, who, value=pending.setting)  # not .value: None for a lock clock only
        self.backend.keep(r.card)  # kept: what the change found is no longer what a later revert puts back
        self._settle(r.card, who.conn)

    def _op_reset(self, who: Client, r: s.Reset) -> Knob:
        hold = self.book.holds.get(r.card)
        if hold is not None and hold.conn != who.conn:
            if not r.force:
                self.book.check_writer(r.card, who.conn, who.peer)
            self._drop_other(r.card, hold.conn, f"reset to stock by uid {who.peer.uid} (--force)")
        knob = self.backend.reset(r.card)
        self._audit("reset", r.card, who, force=r.force)
        self._settle(r.card, who.conn)
        return knob

    def _op_lock_clock(self, who: Client, r: s.LockClock) -> s.LockResult:
        key = self._writer(r.card, who)
        if (r.mhz is None) == (r.measured_mhz is None):
            raise Refused("bad-request", "lock_clock needs exactly one of mhz and measured_mhz")
        knob = self.backend.knob(r.card)
        if knob.lock_clock_mhz is None:
            raise no_lock_clock()
        current = self.book.pending.get(r.card)
        before = dataclasses.replace(current) if current is not None else None
        pending = self._pending_for(r.card, key, who, knob, current.lease_s if current else DEFAULT_LEASE_S)
        if pending.previous_lock_mhz is None:
            pending.previous_lock_mhz = knob.lock_clock_mhz
        self._journal(pending, who, before)
        if r.mhz is not None:
            self.backend.set_lock_clock(r.card, r.mhz)
            chosen: int | None = r.mhz
        else:
            chosen = self.backend.lock_at_measured_clock(r.card, float(r.measured_mhz or 0.0))
        self._audit("lock_clock", r.card, who, mhz=chosen)
        return s.LockResult(chosen)

    def _op_persistence(self, who: Client, r: s.Persistence) -> s.PersistenceResult:
        """Read NVIDIA's persistence mode; `enable` turns it on (never off), only for root: the boot and resume
        runs, for the cards they apply to. A member of the group has no other reason to change the driver's mode,
        and it outlasts every lease (nothing puts it back)."""
        device = self.devices[r.card]
        if device.vendor != "nvidia" or device.simulated:
            raise Unsupported(f"{r.card} has no persistence mode (an NVIDIA driver setting)")
        if r.enable:
            if who.peer.uid != 0:
                raise PermissionDenied(f"only root turns persistence mode on through the helper (uid {who.peer.uid} "
                                       "asked); the boot and resume units do it for the cards they apply to",
                                       "run `sudo tuner apply --boot`, or enable NVIDIA's persistence daemon (`sudo "
                                       "systemctl enable --now nvidia-persistenced`)")
            self._writer(r.card, who)
            if self.backend.persistence_off(r.card):
                self.backend.enable_persistence(r.card)  # read back there: NotApplied if it does not read on
                self._audit("persistence_on", r.card, who)
        return s.PersistenceResult(self.backend.persistence_off(r.card))

    def _op_note_load(self, who: Client, r: s.NoteLoad) -> None:
        self.backend.note_load(r.card, r.active)
        if r.active:
            self.book.loads[r.card] = who.conn
        else:
            self.book.loads.pop(r.card, None)

    def _op_heartbeat(self, who: Client, r: s.Heartbeat) -> s.HeartbeatResult:
        self.book.renew(who.conn, self.clock())
        return s.HeartbeatResult(self.lost.pop(who.conn, []))

    def _op_claim(self, who: Client, r: s.Claim) -> None:
        self._writer(r.card, who)
        purpose = printable(r.purpose)  # shown to other users in their `busy` line, as the holder's command is
        self.book.hold(r.card, who.conn, who.peer, time.time(), purpose, explicit=True)
        self._audit("claim", r.card, who, purpose=purpose)

    def _op_release(self, who: Client, r: s.Release) -> None:
        self.book.release(r.card, who.conn)

    def _op_trial_begin(self, who: Client, r: s.TrialBegin) -> s.OpenTrial:
        key = self._writer(r.card, who)
        if key in self.state.open_trials():
            raise Refused("usage", f"a trial is already open on {r.card}", "end it first (trial_end)")
        knob = self.backend.knob(r.card)
        # a value no set could write (out of range or step: OutOfRange) would be held as the card's open trial
        # for nothing; an overvolt within the range is a set's question (`--allow-overvolt`), not the trial's
        knob.validate(r.setting, allow_overvolt=True)
        trial = s.OpenTrial(card=r.card, key=key, setting=r.setting, stock=knob.stock, unit=knob.unit, phase=r.phase,
                            session=r.session, uid=who.peer.uid, pid=who.peer.pid, helper_pid=os.getpid(),
                            boot_id=current_boot_id(), started_at=time.time())
        self.state.set_open_trial(key, trial)  # durable before the trial's setting touches the card
        self.book.hold(r.card, who.conn, who.peer, time.time())
        self.book.trials[r.card] = who.conn
        self.ended.get(who.conn, {}).pop(r.card, None)  # its end is this trial's now
        self._audit("trial_begin", r.card, who, setting=r.setting, phase=r.phase)
        return trial

    def _op_trial_end(self, who: Client, r: s.TrialEnd) -> None:
        key = self.keys[r.card]
        ended = self.ended.get(who.conn, {}).get(r.card)
        if ended is not None:  # a forced reset ended it (and said so); a hard failure seen at its setting still
            if r.unsafe is not None:  # counts: the reset may well be why the card came back (never applied again)
                self._mark_unsafe(key, ended, r.unsafe, serial=self.devices[r.card].serial)
                self._audit("trial_end", r.card, who, setting=ended.setting, unsafe=r.unsafe.kind)
            # taken only now: a mark whose write failed (a full disk) can be sent again
            self.ended.get(who.conn, {}).pop(r.card, None)
            return
        trial = self.state.open_trials().get(key)
        if trial is None or self.book.trials.get(r.card) != who.conn:
            raise Refused("no-trial", f"this connection has no open trial on {r.card}", "begin one with trial_begin")
        if r.unsafe is not None:
            self._mark_unsafe(key, trial, r.unsafe, serial=self.devices[r.card].serial)
        self.state.set_open_trial(key, None)
        self.book.trials.pop(r.card, None)
        self.book.release_if_idle(r.card, who.conn)
        self._audit("trial_end", r.card, who, setting=trial.setting, unsafe=r.unsafe.kind if r.unsafe else None)

    def _op_read_trials(self, who: Client, r: s.ReadTrials) -> s.TrialsResult:
        key = self.keys[r.card]
        return s.TrialsResult(self.state.open_trials().get(key), self.state.recovered(key))

    def _op_unsafe_list(self, who: Client, r: s.UnsafeList) -> list[s.UnsafeEntry]:
        return self.state.unsafe_entries(self.keys[r.card])

    def _op_unsafe_clear(self, who: Client, r: s.UnsafeClear) -> list[s.UnsafeEntry]:
        key = self._writer(r.card, who)  # a write: not under another connection's bisect, not on a damaged state
        removed = self.state.clear_unsafe(key, r.setting)
        self._audit("unsafe_clear", r.card, who, settings=[e.setting for e in removed])
        return removed

    # --- putting things back ------------------------------------------------------------------------------------
    def _restore(self, pending: Pending) -> tuple[int | None, str]:
        """Put the card back where it was before `pending`: the lock clock, then the previous value, else stock."""
        card, note = pending.card, ""
        if pending.previous_lock_mhz is not None:
            try:
                self.backend.set_lock_clock(card, pending.previous_lock_mhz)
            except TunerError as e:
                note = f"the lock clock could not be set back ({e.message}); "
        if pending.value is None and not note:
            # only a lock clock was chosen (the helper's memory until a value is written): the card holds what it
            # held, and a revert of a value never written would write over it (NVIDIA: a reset wiping P2's offset)
            return pending.previous, "the lock clock choice is back; nothing was written to the card"
        try:
            knob = self.backend.knob(card)
            stock: int | None = knob.stock
        except TunerError as e:  # a card that fell off the bus: still try a reset, and go on with the others
            stock, note = None, note + f"the card could not be read ({e.message}); "
        if pending.previous != stock and not note:
            try:  # never applied again automatically once it failed hard (the list may have it since the change)
                listed = [e.setting for e in self.state.unsafe_entries(pending.key) if e.unit == knob.unit]
                if blocking_setting(knob, pending.previous, listed) is not None:
                    note = f"{pending.previous:+d} {knob.unit} is on the machine's unsafe list now; "
            except TunerError as e:
                note = f"the machine's unsafe list could not be read ({e.message}); "
        if not note:  # a stock value too: the knob is one figure, and NVIDIA's revert puts back every pstate's
            try:
                if self.backend.revert(card, pending.previous).current == pending.previous:
                    return pending.previous, note + "the previous value is back"
            except TunerError as e:
                note += f"the previous value could not be written back ({e.message}); "
        try:
            return self.backend.reset(card).current, note + "reset to stock"
        except TunerError as e:
            return None, note + f"the card could not be reset ({e.message}): reboot to return it to stock"

    def _revert(self, pending: Pending, reason: str) -> s.LostChange:
        restored, how = self._restore(pending)
        self._settle(pending.card, pending.conn)
        # the setting, as the lost change says: `value` is None for a change that only chose the lock clock
        self.state.log("revert", card=pending.card, value=pending.setting, restored=restored, reason=reason)
        self._log(f"revert {pending.card} {pending.setting} -> {restored} ({reason}; {how})")
        return s.LostChange(pending.card, pending.setting, restored, f"{reason}; {how}")

    def _drop_other(self, card: str, conn: int, reason: str) -> None:
        """Another connection loses the card (a forced reset): its change is forgotten, it learns on its next
        heartbeat. Its open trial ends as a dead client's does (inconclusive): left open with no one holding the
        card, it would refuse every other trial there and be blamed for a freeze at someone else's later value; the
        client's own trial_end of it is then answered once as done (`ended`), so the error it reports is its own, and
        a hard-failure mark it carries goes on the list as ever: it was seen at that trial's setting."""
        pending = self.book.pending.pop(card, None)
        trial = self.state.open_trials().get(self.keys[card]) if self.book.trials.get(card) == conn else None
        if pending is not None:
            self.lost.setdefault(conn, []).append(s.LostChange(card, pending.setting, None, reason))
        elif trial is not None:  # no change of its trial's yet: its next write must still learn the card is gone
            self.lost.setdefault(conn, []).append(s.LostChange(card, trial.setting, None, reason))
        if trial is not None:
            self._recover_trial(self.keys[card], "inconclusive", "tool-died",
                                f"{reason} during this trial: not evidence about the voltage; it runs again")
            self.book.trials.pop(card, None)
            self.ended.setdefault(conn, {})[card] = trial
        self.book.holds.pop(card, None)

    def expire_leases(self) -> None:
        """Put back every change whose lease ran out (called a few times a second)."""
        with self.lock:
            for pending in self.book.expired(self.clock()):
                lost = self._revert(pending, f"its lease of {pending.lease_s:g} s ran out without a heartbeat")
                self.lost.setdefault(pending.conn, []).append(lost)

    def connection_closed(self, who: Client) -> None:
        """The client went away (exit, crash, kill -9): everything it left unconfirmed goes back."""
        with self.lock:
            # one card's failure (a full disk under the state directory) must not keep the others from going back
            for pending in self.book.pending_of(who.conn):
                try:
                    self._revert(pending, f"the client (uid {who.peer.uid} pid {who.peer.pid}) went away unconfirmed")
                except TunerError as e:
                    self._log(f"putting back {pending.card} after its client went away: {e.one_line()}")
            for card in sorted(self.book.cards_of(who.conn)):
                try:
                    if self.book.loads.get(card) == who.conn:
                        self.backend.note_load(card, False)
                    if self.book.trials.get(card) == who.conn:
                        self._recover_trial(self.keys[card], "inconclusive", "tool-died",
                                            f"the client (pid {who.peer.pid}) went away during this trial: not "
                                            "evidence about the voltage; it runs again")
                except TunerError as e:
                    self._log(f"releasing {card} after its client went away: {e.one_line()}")
                finally:
                    if self.book.loads.get(card) == who.conn:
                        self.book.loads.pop(card, None)
                    if self.book.trials.get(card) == who.conn:
                        self.book.trials.pop(card, None)
                    hold = self.book.holds.get(card)
                    if hold is not None and hold.conn == who.conn:
                        del self.book.holds[card]
            self.lost.pop(who.conn, None)
            self.ended.pop(who.conn, None)

    def shutdown(self) -> None:
        """SIGTERM: every unconfirmed change goes back; open trials are recorded as interrupted."""
        with self.lock:
            self.stopped = True
            for pending in list(self.book.pending.values()):
                self._revert(pending, "the helper was stopped")
            for card in list(self.book.trials):
                self._recover_trial(self.keys[card], "inconclusive", "tool-died",
                                    "the helper was stopped during this trial; it runs again")
            self.book.trials.clear()

    def _mark_unsafe(self, key: str, trial: s.OpenTrial, mark: s.UnsafeMark, *, serial: str | None = None,
                     source: str = "helper") -> None:
        """The trial's setting goes on the card's unsafe list (stock never does); its words are escaped, as they are
        shown to every other user. A setting the helper would never write adds nothing to refuse and is not
        recorded (`_refused_already`): each mark is a new line, and a member looping trial_begin/trial_end grew the
        list past the reply the client reads (schema.MAX_REPLY_BYTES), failing every user on that card."""
        if trial.setting != trial.stock and not self._refused_already(key, trial):
            self.state.add_unsafe(key, s.UnsafeEntry(
                setting=trial.setting, unit=trial.unit, kind=shown(mark.kind), reason=shown(mark.reason),
                edge=mark.edge, device=trial.card, serial=serial, session=trial.session, boot_id=current_boot_id(),
                recorded_at=time.time(), kernel_log=[shown(text) for text in mark.kernel_log], uid=trial.uid,
                source=source))

    def _refused_already(self, key: str, trial: s.OpenTrial) -> bool:
        """True when no set could ever write the trial's setting to the card under `key`: outside its range or step
        (`Knob.validate`; an overvolt counts, the helper may allow it), or at or beyond a setting of its unit its
        list holds (`unsafe_rule`). Such a trial never touched the card, so the list holds at most one entry a
        value of the card's range. A card or list that cannot be read: False, the mark is recorded as ever."""
        knob = self._knob_once(key, {})
        if knob is None or knob.unit != trial.unit:
            return False
        if self._never_written(knob, trial.setting, trial.unit):
            return True
        try:
            listed = [e.setting for e in self.state.unsafe_entries(key) if e.unit == trial.unit]
        except TunerError:
            return False
        return blocking_setting(knob, trial.setting, listed) is not None

    @staticmethod
    def _never_written(knob: Knob | None, setting: int, unit: str) -> bool:
        """True when no set could ever write `setting` to the card of `knob`: outside its range or step
        (`Knob.validate`; an overvolt counts, the helper may allow it). Listed, it refuses nothing the card can
        take, and one beyond stock (+5 mV on a -200..0 card) refused stock itself. An unreadable card (None) or
        another knob's unit: False, recorded as ever."""
        if knob is None or knob.unit != unit:
            return False
        try:
            knob.validate(setting, allow_overvolt=True)
        except TunerError:
            return True
        return False

    def _recover_trial(self, key: str, verdict: str, kind: str, reason: str) -> None:
        trial = self.state.open_trials().get(key)
        if trial is None:
            return
        self.state.add_recovered(s.RecoveredTrial(trial, verdict, kind, reason, time.time(), current_boot_id()))
        if verdict == "fail":
            self._mark_unsafe(key, trial, s.UnsafeMark(kind, reason), source="recovered at helper start")
        self.state.set_open_trial(key, None)
        self._log(f"recovered the open trial at {trial.setting:+d} {trial.unit} on {trial.card}: {verdict} ({reason})")

    def recover_at_start(self) -> None:
        """After a helper death (kill -9) or a machine reset: put back what the dead helper left unconfirmed (in
        this boot; a reboot already put the cards at stock) and record its open trials as a tuner death is."""
        with self.lock:
            for name, device in self.devices.items():
                # a list an older helper kept under a placeholder serial was every such card's: which one hung is
                # unknown, so each keeps refusing what it holds (never fewer refusals after an upgrade)
                # and one kept under the serial an older helper read (the FRU's, or none: the slot) is this card's
                for old in older_keys(self.state.root, device, self.backend.former_serials(name)):
                    self.state.merge_unsafe(self.keys[name], self.state.unsafe_entries(old))
            boot = current_boot_id()
            by_key = {key: card for card, key in self.keys.items()}
            for key, write in self.state.writes().items():
                card = by_key.get(key)
                if card is not None and same_boot(write.boot_id, boot):
                    try:
                        fits = write.found is None or self.backend.adopt_found(card, write.found)
                    except TunerError:
                        fits = False  # an unreadable card: _restore reads it again, and resets it
                    if not fits:
                        self._log(f"the state {card}'s change found does not fit the card now: its previous value "
                                  "goes back instead")
                    pending = Pending(-1, card, key, write.previous, write.previous_lock_mhz, write.value, 0.0, 0.0)
                    self._revert(pending, f"the helper (pid {write.helper_pid}) died before it was confirmed")
                elif card is not None and (boot is None or write.boot_id is None):
                    # whether the machine reset since cannot be told: stock is safe either way (after a reset the
                    # card is there already); dropping the record would leave an unconfirmed change for good
                    try:
                        stock = self.backend.knob(card).stock
                    except TunerError:
                        stock = 0  # unreadable: _restore reads it again and resets
                    pending = Pending(-1, card, key, stock, None, write.value, 0.0, 0.0)
                    self._revert(pending, f"the helper (pid {write.helper_pid}) died before it was confirmed and "
                                          "the boot id is unreadable")
                else:
                    self.state.set_write(key, None)
            for key, trial in self.state.open_trials().items():
                if same_boot(trial.boot_id, boot):
                    self._recover_trial(key, "inconclusive", "tool-died",
                                        f"the helper (pid {trial.helper_pid}) died during this trial in this boot: "
                                        "not evidence about the voltage; it runs again")
                elif boot is None or trial.boot_id is None:
                    self._recover_trial(key, "fail", "system-reset", "the helper died during this trial and the "
                                        "boot id is unreadable, so a machine reset cannot be ruled out")
                else:
                    self._recover_trial(key, "fail", "system-reset",
                                        "the machine froze or reset during this trial (open in an earlier boot)")

    # --- importing a user's own state ---------------------------------------------------------------------------
    def import_user(self, uid: int) -> None:
        """Merge `uid`'s per-user unsafe list (and trials its journal left open in an earlier boot) into the
        machine's."""
        try:
            home = Path(pwd.getpwuid(uid).pw_dir)
        except KeyError:
            return
        found = read_user_state(home, uid)
        for problem in found.problems:  # it names the user's files: a newline in a name would forge a log line
            self._log(f"import from uid {uid}: skipped {printable(problem)}")
        if found.more_problems:  # one line, however many: the user writes these
            self._log(f"import from uid {uid}: skipped {found.more_problems} more files or lines (their own tuner "
                      "refuses a damaged file until it is repaired)")
        by_serial = {d.serial: card for card, d in self.devices.items() if d.serial}
        boot = current_boot_id()
        by_key: dict[str, list[s.UnsafeEntry]] = {}  # merged once per card (state.merge_unsafe says why)
        elsewhere = never = 0
        knobs: dict[str, Knob | None] = {}  # read once per card, not once per line
        with self.lock:
            for line in found.unsafe:
                if line.setting == 0:
                    continue  # stock (every knob is an offset: Knob.offset) never goes on a list (_mark_unsafe)
                key = self._key_for(line.serial, line.device, by_serial)
                if key is None:
                    elsewhere += 1
                    continue
                if self._never_written(self._knob_once(key, knobs), line.setting, line.unit):
                    never += 1
                    continue
                # the words are shown to every other user, and held to a trial_end mark's limits (the wire's): a
                # member's file must not grow root's list beyond what a trial's end can
                by_key.setdefault(key, []).append(s.UnsafeEntry(
                    setting=line.setting, unit=line.unit, kind=shown(line.kind), reason=shown(line.reason),
                    edge=line.edge, device=line.device,
                    serial=line.serial, session=line.session, boot_id=line.boot_id, recorded_at=line.recorded_at,
                    kernel_log=[shown(text) for text in line.kernel_log[-s.MAX_KERNEL_LOG_LINES:]],
                    uid=uid, source=f"import from uid {uid}"))
            for device, trial in found.open_trials:
                if trial.boot_id is None or same_boot(trial.boot_id, boot) or trial.setting == 0:
                    continue  # open in this boot: the user's tuner decides (it may still run); 0 is stock
                # under the card it ran on and in its unit (the journal's: the slot may hold another card since);
                # an older journal says neither: the card in its slot, in that card's unit
                key = self._key_for(trial.serial, device, by_serial)
                if key is None:
                    elsewhere += 1
                    continue
                try:
                    unit = trial.unit or self._unit_of(device)
                except TunerError as e:  # one card's unreadable knob must not refuse this user's hello (or the start)
                    self._log(f"import from uid {uid}: skipped the open trial on {device} until its unit can be read "
                              f"(it stays in their journal): {printable(e.one_line())}")
                    continue
                if self._never_written(self._knob_once(key, knobs), trial.setting, unit):
                    never += 1
                    continue
                by_key.setdefault(key, []).append(s.UnsafeEntry(
                    setting=trial.setting, unit=unit, kind="system-reset",
                    reason=f"a {trial.phase} trial was open when the machine froze or reset (uid {uid}'s journal)",
                    device=device, serial=trial.serial, session=trial.session, boot_id=trial.boot_id,
                    recorded_at=trial.started_at or 0.0, uid=uid, source=f"import from uid {uid}"))
            added = left = 0
            cards = {key: card for card, key in self.keys.items()}
            for key, entries in by_key.items():
                try:
                    merged = self.state.merge_unsafe(key, entries, max_bytes=MAX_IMPORTED_LIST_BYTES)
                    added, left = added + merged[0], left + merged[1]
                except TunerError as e:  # that card's writes are refused (fail closed), not this user's hello
                    self._log(f"import from uid {uid}: skipped {len(entries)} entries of {cards[key]} for now "
                              f"(they stay in the user's files): {printable(e.one_line())}")
        if added:
            self._log(f"imported {added} unsafe entries from uid {uid}")
        if left:  # likewise
            self._log(f"import from uid {uid}: skipped {left} more entries: their card's machine list holds "
                      f"{MAX_IMPORTED_LIST_BYTES} bytes already (their own tuner still refuses them)")
        if never:  # likewise
            self._log(f"import from uid {uid}: skipped {never} entries at settings their card cannot take (outside "
                      "its range or step: they refuse nothing it can be set to)")
        if elsewhere:  # one line, however many: the user writes these
            self._log(f"import from uid {uid}: skipped {elsewhere} entries naming no card of this machine (their "
                      "own tuner still refuses them)")

    def _knob_once(self, key: str, knobs: dict[str, Knob | None]) -> Knob | None:
        """The knob of the card under `key`, read once into `knobs`; None when it cannot be read."""
        if key not in knobs:
            card = next((c for c, k in self.keys.items() if k == key), None)
            try:
                knobs[key] = self.backend.knob(card) if card is not None else None
            except TunerError:
                knobs[key] = None
        return knobs[key]

    def _key_for(self, serial: str | None, device: str | None, by_serial: dict[str, str]) -> str | None:
        """The machine list of the card a user's entry names, or None when it names no card of this machine: a list
        of its own would never be read (no card has its key), and each made-up name would be a file root creates."""
        card = (by_serial.get(serial) if serial else None) or self._card_named(device)
        return self.keys[card] if card else None

    def _unit_of(self, device: str) -> str:
        card = self._card_named(device)
        return self.backend.knob(card).unit if card else "mV"

    def _card_named(self, device: str | None) -> str | None:
        """The card a user's file names by its id (a file name spells its `:` as `_`), or None."""
        return next((card for card in self.devices if device in (card, card.replace(":", "_"))), None)


def shown(text: str) -> str:
    """A word of an unsafe entry as every other user is shown it: escaped (`printable`), and held to the wire's
    MAX_TEXT_CHARS after escaping too, which makes one character up to seven (U+E0001 is `\\ue0001`): an entry of
    22 such words was ~88 KB, and a card's list is read whole at every set."""
    return printable(text[:s.MAX_TEXT_CHARS])[:s.MAX_TEXT_CHARS]


def code_of(error: TunerError) -> str:
    """The wire code of a TunerError (the client maps it back to the same class and exit code)."""
    if isinstance(error, Refused):
        return error.code
    for code, kind in s.ERRORS.items():
        if isinstance(error, kind):
            return code
    return "usage" if error.exit_code == exit_codes.USAGE else "internal"

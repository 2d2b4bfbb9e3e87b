"""Who may write each card now, and which changes are still unconfirmed: the helper's in-memory book.

One writer per card: a connection holds a card while it has an unconfirmed change, a chosen lock clock or an open
trial on it (an implicit hold, released when those end), or from `claim` until `release` (explicit). Any write by
another connection is refused as busy, naming the holder. The helper is the only writer of the cards, so the
book lives in its memory: a dead helper holds nothing, and its durable writes journal (`state.py`) is what
survives it.

An unconfirmed change remembers the value before this connection's first change of the card (and the lock
clock then): that is what goes back when the lease runs out without a heartbeat, when the connection closes, or
when the helper is stopped. Plain data, no I/O, no locking (the service holds its lock around every call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.core.card_lock import CardBusy
from tuner.helper.peer import Peer


class Busy(CardBusy):
    """Another connection holds the card; `hold` names it (the reply's `holder`)."""

    def __init__(self, message: str, remedy: str, hold: Hold):
        super().__init__(message, remedy)
        self.hold = hold


@dataclass
class Hold:
    conn: int
    peer: Peer
    since: float  # time.time()
    purpose: str
    explicit: bool = False


@dataclass
class Pending:
    """An unconfirmed change of `card` by connection `conn`."""

    conn: int
    card: str
    key: str
    previous: int  # the value before this connection's first unconfirmed change
    previous_lock_mhz: int | None  # NVIDIA: the lock clock then (None: not changed, or no lock clock)
    value: int | None  # the value written now; None: only the lock clock was chosen
    lease_s: float
    deadline: float  # monotonic

    @property
    def setting(self) -> int:
        """The value this change leaves on the card: the one written, or the previous one (lock clock only)."""
        return self.value if self.value is not None else self.previous


@dataclass
class Book:
    holds: dict[str, Hold] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    trials: dict[str, int] = field(default_factory=dict)  # card -> the connection with a trial open on it
    loads: dict[str, int] = field(default_factory=dict)  # card -> the connection that said a load runs on it

    def check_writer(self, card: str, conn: int, peer: Peer) -> None:
        """CardBusy naming the holder when another connection holds `card`."""
        hold = self.holds.get(card)
        if hold is not None and hold.conn != conn:
            who = hold.peer
            raise Busy(f"{card} is busy: uid {who.uid} pid {who.pid} ({hold.purpose or who.command}) holds it "
                           "through the helper; nothing was changed",
                           "wait for it to finish or stop it; `tuner reset --force` puts the card back to stock",
                           hold)

    def hold(self, card: str, conn: int, peer: Peer, now: float, purpose: str = "", *, explicit: bool = False) -> None:
        current = self.holds.get(card)
        if current is None:
            self.holds[card] = Hold(conn, peer, now, purpose or peer.command, explicit)
        elif explicit:
            current.explicit = True
            current.purpose = purpose or current.purpose

    def release_if_idle(self, card: str, conn: int) -> None:
        """Drop `conn`'s implicit hold on `card` once nothing of it is left there."""
        hold = self.holds.get(card)
        if hold is None or hold.conn != conn or hold.explicit:
            return
        if card in self.pending or self.trials.get(card) == conn:
            return
        del self.holds[card]

    def release(self, card: str, conn: int) -> None:
        hold = self.holds.get(card)
        if hold is not None and hold.conn == conn:
            hold.explicit = False
            self.release_if_idle(card, conn)

    def pending_of(self, conn: int) -> list[Pending]:
        return [p for p in self.pending.values() if p.conn == conn]

    def renew(self, conn: int, now: float) -> None:
        for p in self.pending_of(conn):
            p.deadline = now + p.lease_s

    def expired(self, now: float) -> list[Pending]:
        return [p for p in self.pending.values() if p.deadline <= now]

    def cards_of(self, conn: int) -> set[str]:
        """Every card `conn` has anything on."""
        return ({c for c, h in self.holds.items() if h.conn == conn} | {p.card for p in self.pending_of(conn)}
                | {c for c, t in self.trials.items() if t == conn} | {c for c, t in self.loads.items() if t == conn})

"""The root helper's wire protocol, declared once: every request it accepts, every reply it sends.

JSON lines over a unix socket. A request is one object whose `op` names it; its fields are declared below and
nothing else is accepted (`forbid_unknown_fields`: a `path`, or any field a version does not know, is refused).
A card is named by its id (the PCI slot, or the simulated backend's `simN`), never by a path: the pattern has no
`/`. Every reply carries the request's `id`, `ok`, and either `result` or `code` + `error` (+ `remedy`, and
`holder` for `busy`). The first request must be `hello` with this `PROTOCOL_VERSION`.

The helper (`tuner/helper/service.py`) and its client (`tuner/backends/helper_client.py`) both use this module;
it imports nothing of either (an import-linter contract says so).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from tuner.core import errors
from tuner.core.card_lock import CardBusy
from tuner.core.documents import one_of
from tuner.core.models import KIND_UNITS, Capabilities, DeviceInfo

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 4096  # one request line, newline included; a longer line is refused unread
# one reply line, newline included: the largest is a card's unsafe list, a few dozen entries of a few KiB each; a
# longer line is no helper's (another program on the socket, a broken helper) and the client stops reading it
MAX_REPLY_BYTES = 64 << 20

# \A and \Z, not ^ and $: msgspec checks a pattern with re.search, and `$` matches before a final newline too
# ("coarse\n" was a Word: it split the helper's audit line and reached the unsafe list other users read)
Card = Annotated[str, msgspec.Meta(pattern=r"\A[A-Za-z0-9][A-Za-z0-9:._-]{0,63}\Z")]
Setting = Annotated[int, msgspec.Meta(ge=-100_000, le=100_000)]  # in the knob's unit; the card's range decides
LeaseS = Annotated[float, msgspec.Meta(ge=1.0, le=600.0)]
MAX_TEXT_CHARS = 500  # a reason, a client's name, a kernel-log line: from the wire, or imported from a user's file
MAX_KERNEL_LOG_LINES = 20  # an unsafe mark's kernel-log lines, likewise
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
Word = Annotated[str, msgspec.Meta(pattern=r"\A[a-z][a-z0-9_-]{0,39}\Z")]
Session = Annotated[str, msgspec.Meta(pattern=r"\A[A-Za-z0-9_.-]{1,80}\Z")]
# what a member's own files say of a card, imported as root onto the list every user is shown (user_import): a
# knob's unit; a driver's serial (an NVIDIA UUID, amdgpu's unique_id, a board's FRU serial: printable ASCII); a
# boot id (/proc/sys/kernel/random/boot_id, a UUID; kernel_files.BOOT_ID_MAX_BYTES)
Unit = Annotated[str, one_of(KIND_UNITS.values())]
Serial = Annotated[str, msgspec.Meta(pattern=r"\A[ -~]{1,128}\Z")]
BootId = Annotated[str, msgspec.Meta(pattern=r"\A[A-Za-z0-9_.-]{1,64}\Z")]
RequestId = Annotated[int, msgspec.Meta(ge=0, le=2**53)]


class _Request(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    id: RequestId = 0


class CardRequest(_Request):
    """A request about one card, named by its id (never by a path); the helper checks it has that card first."""

    card: Card


class Hello(_Request, tag="hello"):
    """First on every connection: the protocol version this client speaks, and what it is (for `busy` lines)."""

    version: int = 0
    client: Text = ""


class ListCards(_Request, tag="list"):
    """Every card the helper drives, with its capabilities and the key its safety state is filed under."""


class ReadKnob(CardRequest, tag="read_knob"):
    """The undervolt knob with its current value and the device's real range."""


class ReadTelemetry(CardRequest, tag="read_telemetry"):
    """One telemetry sample; fields the device does not report are None."""


class ReadTarget(CardRequest, tag="read_target"):
    """How the stress engine reaches the card (its torch device, PCI bus id; a simulated card's faults)."""


class ReadState(CardRequest, tag="read_state"):
    """Another tool's setting on the card, and the NVIDIA performance states an offset covers."""


class Set(CardRequest, tag="set"):
    """Write `value`, read it back. Unconfirmed, it is put back when `lease_s` runs out without a heartbeat or
    when this connection closes. `revert`: the client's revert of its unconfirmed change, whose `value` it found;
    where none is left (its lease ran out, a forced reset) nothing is written."""

    value: Setting
    lease_s: LeaseS = 10.0
    allow_overvolt: bool = False
    revert: bool = False


class Confirm(CardRequest, tag="confirm"):
    """Keep this connection's change on the card: it is no longer put back."""


class Reset(CardRequest, tag="reset"):
    """Stock, verified. `force`: even while another client holds the card (its change is dropped)."""

    force: bool = False


class LockClock(CardRequest, tag="lock_clock"):
    """NVIDIA: the max graphics clock the next `set` locks at; exactly one of `mhz` (a supported clock) and
    `measured_mhz` (a clock measured under the stock baseline, snapped down to a supported one)."""

    mhz: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    measured_mhz: Annotated[float, msgspec.Meta(ge=1.0, le=10_000.0)] | None = None


class Persistence(CardRequest, tag="persistence"):
    """NVIDIA: the card's persistence mode; `enable`: turn it on first (nvmlDeviceSetPersistenceMode, what
    `nvidia-smi -pm 1` does) and read it back. There is no request that turns it off. Only root may enable it
    (the boot and resume units, for the cards they apply to: docs/install.md, "NVIDIA at boot")."""

    enable: bool = False


class NoteLoad(CardRequest, tag="note_load"):
    """A stress run starts or stops on the card (the simulated card's telemetry needs it)."""

    active: bool


class Heartbeat(_Request, tag="heartbeat"):
    """Renew every lease of this connection; the reply lists changes put back since the last one."""


class Claim(CardRequest, tag="claim"):
    """Hold the card for this connection until `release` or the connection closes (one writer per card)."""

    purpose: Text = ""


class Release(CardRequest, tag="release"):
    """End this connection's `claim` of the card."""


class UnsafeMark(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Why a trial's setting goes on the machine's unsafe list (a hang, a reset, a lost card)."""

    kind: Word
    reason: Text
    edge: bool = True
    kernel_log: Annotated[list[Text], msgspec.Meta(max_length=MAX_KERNEL_LOG_LINES)] = []


class TrialBegin(CardRequest, tag="trial_begin"):
    """Journal an open trial durably before its setting touches the card (a freeze leaves it open)."""

    setting: Setting
    phase: Word
    session: Session | None = None


class TrialEnd(CardRequest, tag="trial_end"):
    """Close this connection's open trial; `unsafe`: its setting failed hard and goes on the unsafe list."""

    unsafe: UnsafeMark | None = None


class ReadTrials(CardRequest, tag="read_trials"):
    """The card's open trial and the trials recovered after a death (the client's, the helper's, a reset)."""


class UnsafeList(CardRequest, tag="unsafe_list"):
    """The card's entries on the machine's unsafe list."""


class UnsafeClear(CardRequest, tag="unsafe_clear"):
    """Remove the card's unsafe entries (all, or those for `setting`); the caller asked its user first."""

    setting: Setting | None = None


class KernelEvents(_Request, tag="kernel_events"):
    """Turn this connection into a stream of kernel-log lines naming these cards (or GPU failures naming none)."""

    cards: Annotated[list[Card], msgspec.Meta(max_length=64)]


Request = (Hello | ListCards | ReadKnob | ReadTelemetry | ReadTarget | ReadState | Set | Confirm | Reset | LockClock
           | Persistence | NoteLoad | Heartbeat | Claim | Release | TrialBegin | TrialEnd | ReadTrials | UnsafeList
           | UnsafeClear | KernelEvents)


# --- replies --------------------------------------------------------------------------------------------------------
class Holder(msgspec.Struct, frozen=True):
    """Who holds a card: named in every `busy` reply."""

    uid: int
    pid: int
    command: str
    since: float


class _Reply(msgspec.Struct):
    id: int
    ok: bool
    code: str = ""
    error: str = ""
    remedy: str = ""
    holder: Holder | None = None


class Reply(_Reply, omit_defaults=True):
    """What the helper sends (`result` is any of the result types below, or a core dataclass)."""

    result: Any = None


class RawReply(_Reply):
    """What the client reads: `result` is decoded later, with the type its request expects."""

    result: msgspec.Raw = msgspec.Raw(b"null")


class SimConfig(msgspec.Struct, frozen=True):
    """A simulated helper's cards, as `tuner --simulate`'s options describe them (the client compares)."""

    gpus: int
    seed: int
    kind: str
    vmin: int | tuple[int, ...] | None  # one value: sim0's limit; a tuple: one per card (an array on the wire)
    nondeterministic: bool
    contention_after_s: float | None


class HelloResult(msgspec.Struct, frozen=True):
    version: int
    helper_version: str
    backend: str  # the helper's backend name: "amd", "nvidia", "composite", "simulated"
    simulated: bool
    sim: SimConfig | None
    group: str
    uid: int  # the caller, as the helper sees it
    allow_overvolt: bool


class CardEntry(msgspec.Struct, frozen=True):
    info: DeviceInfo
    capabilities: Capabilities | None  # None: the card cannot be driven (the error says why)
    key: str  # the card's identity key in the machine's safety state
    error: str = ""


class CardState(msgspec.Struct, frozen=True):
    foreign_state: str | None
    applied_pstates: tuple[int, ...] | None


class LockResult(msgspec.Struct, frozen=True):
    mhz: int | None


class PersistenceResult(msgspec.Struct, frozen=True):
    off: bool  # it reads off (NvidiaBackend.persistence_off: False where it reads on or cannot be read)


class LostChange(msgspec.Struct, frozen=True):
    card: str
    value: int
    restored: int | None  # the value put back; None: it could not be (the reason says why)
    reason: str


class HeartbeatResult(msgspec.Struct, frozen=True):
    lost: list[LostChange]


class UnsafeEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One line of the machine's unsafe list (the per-user list's fields, plus who recorded it and where from)."""

    setting: int
    unit: str
    kind: str
    reason: str
    edge: bool = True
    device: str | None = None
    serial: str | None = None
    session: str | None = None
    boot_id: str | None = None
    recorded_at: float = 0.0
    kernel_log: list[str] = []
    uid: int | None = None
    source: str = "helper"  # "helper", "import from uid N", "recovered at start"

    def event(self) -> tuple[int, str, str, str | None, float]:
        """What two copies of one event share (a merge keeps one); hashable, so a merge of many is not quadratic."""
        return (self.setting, self.unit, self.kind, self.session, round(self.recorded_at, 3))


class OpenTrial(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A trial the helper journaled before its setting touched the card."""

    card: str
    key: str
    setting: int
    stock: int
    unit: str
    phase: str
    session: str | None
    uid: int
    pid: int
    helper_pid: int
    boot_id: str | None
    started_at: float


class RecoveredTrial(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An open trial whose owner went away: `verdict` "inconclusive" (the client or the helper died in this boot,
    which says nothing about the voltage) or "fail" (open in an earlier boot: the machine froze or reset)."""

    trial: OpenTrial
    verdict: str
    kind: str
    reason: str
    recovered_at: float
    recovered_boot_id: str | None


class TrialsResult(msgspec.Struct, frozen=True):
    open: OpenTrial | None
    recovered: list[RecoveredTrial]


class KernelLine(msgspec.Struct, frozen=True):
    """One kernel-log line of a `kernel_events` stream, and the cards it names."""

    line: str
    cards: list[str]


# --- codes ----------------------------------------------------------------------------------------------------------
# (code, meaning). The client maps each back to the TunerError (and exit code) the in-process tuner raises.
CODES = {
    "bad-json": "the line is not a JSON object",
    "bad-request": "a field is missing, mistyped, out of its bounds or unknown",
    "unknown-request": "no request of that name",
    "line-too-long": f"a request line is longer than {MAX_REQUEST_BYTES} bytes",
    "hello-first": "the first request must be hello",
    "version": "the client speaks another protocol version",
    "not-allowed": "the caller is neither root nor in the helper's group",
    "too-many": "too many connections",
    "idle": "the connection said nothing for too long",
    "unknown-card": "no card of that id",
    "out-of-range": "the value is outside the card's range, off its step, or an overvolt",
    "overvolt-not-allowed": "the helper's configuration does not allow overvolting",
    "unsafe": "the value is at or beyond one on the machine's unsafe list",
    "busy": "another client holds the card",
    "no-trial": "this connection has no open trial on the card",
    "damaged-state": "a safety file does not validate: nothing is written to the card",
    "not-applied": "the card did not take the value (it was put back)",
    "device-lost": "the card stopped answering",
    "permission": "the OS refused",
    "unsupported": "the card or driver cannot do this",
    "disk-full": "a safety file could not be written",
    "usage": "the request cannot be done as asked",
    "internal": "the helper failed; the request changed nothing it could not put back",
}
# The codes that stand for one of the in-process tuner's errors, both ways: the helper sends the code of the error
# its backend or state raised, the client raises that class again.
ERRORS: dict[str, type[errors.TunerError]] = {
    "busy": CardBusy, "unknown-card": errors.UnknownDevice, "out-of-range": errors.OutOfRange,
    "damaged-state": errors.DamagedState, "device-lost": errors.DeviceLost, "not-applied": errors.NotApplied,
    "permission": errors.PermissionDenied, "unsupported": errors.Unsupported, "disk-full": errors.DiskFull,
}

_decoder = msgspec.json.Decoder(Request)
_encoder = msgspec.json.Encoder()


class BadRequest(Exception):
    """A line that is not a valid request; `code` is one of CODES."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def decode_request(line: bytes) -> Request:
    """The request on this line, or BadRequest with its code and a one-line reason."""
    try:
        return _decoder.decode(line)
    except msgspec.ValidationError as e:
        text = str(e)
        if "`$.op`" in text or "missing required field `op`" in text:
            raise BadRequest("unknown-request", f"unknown request: {text}") from None
        raise BadRequest("bad-request", text) from None
    except msgspec.DecodeError as e:
        raise BadRequest("bad-json", f"not a JSON object: {e}") from None


def encode(message: msgspec.Struct) -> bytes:
    """One JSON line."""
    return _encoder.encode(message) + b"\n"


def op_of(request: Request) -> str:
    return str(type(request).__struct_config__.tag)  # every request's tag is its op's name (a str)

"""The engine's JSON-lines protocol, declared once: every event the engine prints, its fields, their types and
what they mean. Torch-free (the stress client imports it).

- The engine builds these structs and `tuner.engine.protocol.Emitter` writes them (`to_record`): a misspelt or
  missing field is a TypeError where the event is built, a wrong type fails the tests that `validate` every event.
- The stress client (`tuner.tuning.engine_client`) reads lines with `decode_line`, which never raises.
- The event tables of docs/engine.md are `markdown()` (a test keeps them equal: `python -m tuner.engine.events`
  prints them).

Every line carries `"event"` (its name) and `"t"` (seconds since the engine process started, monotonic). A field
declared here is always present (possibly null) unless its type admits `UNSET` (absent when it does not apply).
Non-finite floats are written as the strings "NaN", "Infinity" and "-Infinity", so every line is strict JSON.

Compatibility: fields may be added (a reader ignores fields it does not declare); `PROTOCOL_VERSION` (the
`protocol` field of `start`, and part of every reference's fingerprint) changes when a field is removed or its
meaning changes. A reader meets three kinds of line besides these events (`decode_line`): a JSON object with an
event name this version does not declare (a newer engine: `UnknownEvent`, kept and forwarded, never an error), a
declared event whose fields do not follow this schema (`InvalidEvent`: a bug, since the engine and its client ship
together; the client says so), and anything else (`LogEvent`).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

PROTOCOL_VERSION = 1

VERDICT_EXIT_CODES = {"pass": (0,), "fail": (1,), "error": (2, 4, 130)}  # 4: torch (the engine extra) is missing
FAULT_KINDS = ("mismatch", "canary", "gemm", "nonfinite", "device-error", "not-repeatable")
ERROR_KINDS = ("usage", "setup", "oom", "internal", "interrupted", "not-repeatable", "peer")


def _d(text: str) -> Meta:
    """A field's meaning (the docs table's third column)."""
    return Meta(description=text)


class ProtocolError(ValueError):
    """An event that does not follow this schema."""


# --- objects inside events ------------------------------------------------------------------------------------------


class ModelShape(Struct, frozen=True, kw_only=True):
    depth: Annotated[int, _d("transformer layers")]
    width: Annotated[int, _d("model width")]
    n_head: Annotated[int, _d("attention heads")]
    head_dim: Annotated[int, _d("width of one head")]
    vocab: Annotated[int, _d("vocabulary size (256 for the byte-level presets)")]
    window_pattern: Annotated[str, _d("nanochat's sliding-window pattern, e.g. `SSSL`")]
    windows: Annotated[tuple[int, ...], _d("each layer's attention window in tokens")]
    value_embeds: Annotated[bool, _d("value embeddings on")]
    embed_dtype: Annotated[str, _d("dtype of the embeddings")]


class TokenizerInfo(Struct, frozen=True, kw_only=True):
    kind: Annotated[str, _d("`bpe`")]
    vocab_size: Annotated[int, _d("learnt vocabulary (at most the model's)")]
    sha256: Annotated[str, _d("of the tokenizer")]
    cached: Annotated[bool, _d("false when this run trained it")]
    path: Annotated[str, _d("where it is cached")]


class DataSource(Struct, frozen=True, kw_only=True):
    source: Annotated[str, _d("`stdlib` (the embedded default) or the `--data` path")]
    bytes: Annotated[int, _d("text size")]
    files: Annotated[int, _d("files read")]
    sha256: Annotated[str, _d("of the text")]
    tokens: Annotated[int, _d("tokens (bytes for the byte-level presets)")]
    tokenizer: Annotated[TokenizerInfo, _d("BPE presets only")] | UnsetType = UNSET


class ReferenceInUse(Struct, frozen=True, kw_only=True):
    path: Annotated[str, _d("the `--reference` file")]
    steps: Annotated[int, _d("steps it recorded")]


class ReferenceCompared(Struct, frozen=True, kw_only=True):
    path: Annotated[str, _d("the `--reference` file")]
    reference_steps: Annotated[int, _d("steps it recorded")]
    compared_steps: Annotated[int, _d("steps compared with it")]
    beyond_reference_steps: Annotated[int, _d("steps past the reference's end, not compared")]
    note: Annotated[str | None, _d("says so when there were any")]
    tolerance: Annotated[float | None, _d("the relative loss tolerance; null when bitwise")]
    loop: Annotated[bool, _d("`--reference-loop`")]
    segments: Annotated[int, _d("passes over the reference")]


class FirstDifference(Struct, frozen=True, kw_only=True):
    step: Annotated[int, _d("the step (0: the start-up check)")]
    figure: Annotated[str, _d("what differed")]


class DataParallelStatus(Struct, frozen=True, kw_only=True):
    world_size: Annotated[int, _d("ranks in the group")]
    rank: Annotated[int, _d("this rank")]
    backend: Annotated[str, _d("`gloo` or `nccl`")]
    library: Annotated[str, _d("`gloo`, `nccl` or `rccl`")]
    collectives: Annotated[int, _d("collectives so far")]
    collective_s: Annotated[float, _d("time in them, waits included")]


# --- events ---------------------------------------------------------------------------------------------------------


class Event(Struct, frozen=True, kw_only=True, dict=True, tag_field="event"):
    """Every event: its name (the tag, `"event"`) and `t`. The engine leaves `t` to the emitter, which stamps it.

    `raw` is the object a reader decoded, every field included (also ones this version does not declare); empty
    for an event built in this process. It is not a field: never written, never compared."""

    t: float = 0.0

    @property
    def raw(self) -> dict[str, Any]:
        return self.__dict__.get("_raw", {})

    @property
    def name(self) -> str:
        """The event's name ("step", "end", ...; "log" for a line that was not an event)."""
        tag = type(self).__struct_config__.tag
        return str(self.raw.get("event", tag if isinstance(tag, str) else "log"))


class StartEvent(Event, tag="start", frozen=True, kw_only=True):
    """setup is done, work begins"""

    protocol: Annotated[int, _d(f"protocol version ({PROTOCOL_VERSION})")]
    mode: Annotated[str, _d("`train`, `gemm` or `mixed`, as requested")]
    preset: Annotated[str, _d("the model preset, as requested")]
    device: Annotated[str, _d("the `--device` string")]
    device_type: Annotated[str, _d("`cuda` (also ROCm), `cpu`, `mps`")]
    device_name: Annotated[str, _d("GPU name, or `CPU: <model>`")]
    pci_bus_id: Annotated[str | None, _d("the GPU's PCI bus id, `0000:03:00.0`; null on CPU/MPS")]
    dtype: Annotated[str, _d("`bf16`, `fp16` or `fp32`")]
    params: Annotated[int, _d("parameters (0 in gemm mode)")]
    tokens_per_step: Annotated[int, _d("after the batch fit")]
    flops_per_step: Annotated[int, _d("nanochat's estimate (6 × matmul weights + attention) × tokens; gemm mode: "
                                      "the GEMM round")]
    batch_size: Annotated[int, _d("after the batch fit")]
    seq_len: Annotated[int, _d("tokens per window")]
    model: Annotated[ModelShape | None, _d("the model's shape; null in gemm mode")]
    compile: Annotated[bool, _d("the training steps run compiled (after the compiled-repeatability proof)")]
    seed: Annotated[int, _d("as parsed")]
    steps: Annotated[int | None, _d("the step bound, as parsed")]
    duration_s: Annotated[float | None, _d("the time bound, as parsed")]
    warmup_steps: Annotated[int, _d("steps left out of medians and soft signals")]
    canary_every: Annotated[int, _d("canary replay every K steps (0: off)")]
    canary_every_s: Annotated[float, _d("canary replay every S seconds (0: off)")]
    gemm_n: Annotated[int, _d("GEMM check size")]
    gemm_repeats: Annotated[int, _d("GEMM check repeats")]
    data: Annotated[DataSource | None, _d("the training text; null in gemm mode")]
    repeatable: Annotated[bool, _d("the start-up repeatability check passed")]
    repeatability: Annotated[dict[str, bool | None], _d(
        "`gemm`, `canary`, `attention`, `steps`: bool each (the last three null in gemm mode); `compiled` (only "
        "when compile was on): the training steps ran compiled and repeated")]
    first_difference: Annotated[FirstDifference | None, _d("when the start-up check differed (`step` 0)")]
    sensitivity: Annotated[str, _d("`full`, or `reduced` with `--tolerance`")]
    tolerance: Annotated[bool, _d("`--tolerance`, as requested")]
    verify_repeatable: Annotated[bool, _d("`--verify-repeatable`, as requested")]
    deterministic: Annotated[bool, _d("deterministic algorithms are on")]
    deterministic_mode: Annotated[str, _d("`strict` (always, from this version), `warn` or `off`")]
    kernels: Annotated[dict[str, Any], _d("the kernel choices (see \"Determinism by construction\")")]
    attention_kernels: Annotated[tuple[str, ...] | None, _d(
        "each layer's attention kernel (`flash`, `flash-window`, `math`, `math-window`), in layer order; null in "
        "gemm mode")]
    kernel_env: Annotated[dict[str, str], _d("environment variables that affect kernel selection, as set")]
    driver_version: Annotated[str | None, _d("the GPU driver's version")]
    threads: Annotated[int, _d("torch CPU threads")]
    reference: Annotated[ReferenceInUse | None, _d("the reference being compared")]
    record: Annotated[str | None, _d("where the digests will be saved")]
    fault_rate: Annotated[float, _d("fault injection in force")]
    fault_seed: Annotated[int, _d("the fault-injection seed in effect")]
    injections: Annotated[tuple[str, ...], _d("injected faults, e.g. `nan@9`")]
    visible_devices: Annotated[dict[str, str], _d(
        "`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER` when set")]
    setup_problems: Annotated[tuple[str, ...], _d("e.g. the batch step-downs")]
    data_parallel: Annotated[DataParallelStatus | None, _d("data-parallel ranks (as in `end`)")]
    torch_version: Annotated[str, _d("torch's version")]
    cuda_version: Annotated[str | None, _d("CUDA's version (null on other builds)")]
    hip_version: Annotated[str | None, _d("HIP's version (null on other builds)")]


class StepEvent(Event, tag="step", frozen=True, kw_only=True):
    """one training step finished (train and mixed modes)"""

    step: Annotated[int, _d("the step, from 1")]
    loss: Annotated[float, _d("raw, nats per token (per byte for byte-level presets), not smoothed")]
    grad_norm: Annotated[float, _d("raw total L2 norm before the optimizer")]
    dt_ms: Annotated[float, _d("wall time of the step including the host sync")]
    tok_s: Annotated[float | None, _d("tokens per second")]
    tflops: Annotated[float | None, _d("model FLOP/s achieved, in TFLOP/s")]
    phase: Annotated[str, _d("mixed mode only: `full` or `partial`")] | UnsetType = UNSET


class GemmEvent(Event, tag="gemm", frozen=True, kw_only=True):
    """one GEMM round (gemm mode)"""

    step: Annotated[int, _d("round number")]
    ok: Annotated[bool, _d("every repeat bit-equal to the first")]
    dt_ms: Annotated[float, _d("wall time of the round")]
    tflops: Annotated[float | None, _d("achieved")]
    n: Annotated[int, _d("matrix size")]
    repeats: Annotated[int, _d("repeats compared")]


class CanaryEvent(Event, tag="canary", frozen=True, kw_only=True):
    """a canary replay (and GEMM check) ran"""

    step: Annotated[int, _d("the training step after which it ran")]
    index: Annotated[int, _d("1, 2, ...")]
    reason: Annotated[str, _d("`scheduled`, `time` or `soft-signal`")]
    ok: Annotated[bool, _d("canary bit-equal to its first result")]
    gemm_ok: Annotated[bool, _d("the GEMM check that ran with it passed")]
    digest: Annotated[str, _d("16 hex digits of the canary result")]
    dt_ms: Annotated[float, _d("wall time")]


class WarningEvent(Event, tag="warning", frozen=True, kw_only=True):
    """something worth knowing, never a failure by itself"""

    step: Annotated[int, _d("completed steps when it was seen")]
    kind: Annotated[str, _d("`loss-spike`, `grad-spike`, `throughput-drop`, `oom`, `compile`, `environment`")]
    detail: Annotated[str, _d("one line")]
    setup: Annotated[bool, _d("true for setup problems such as an out-of-memory batch step-down")]


class FaultEvent(Event, tag="fault", frozen=True, kw_only=True):
    """a detector fired; the run ends with verdict `fail`"""

    kind: Annotated[str, _d("`" + "`, `".join(FAULT_KINDS) + "`")]
    step: Annotated[int | None, _d("the step it was found at; 0 for the start-up check; null when a device error "
                                   "came before setup ended")]
    reference_step: Annotated[int | None, _d(
        "the reference step that step is compared with: the same as `step`, or with `--reference-loop` the step "
        "within the pass, `(step - 1) % reference_steps + 1`; null without a reference")]
    detail: Annotated[str, _d("one line")]
    figure: Annotated[str | None, _d(
        "the reference figure that differed: `loss`, `grad_norm`, `grads` (a data-parallel rank's own gradients "
        "before the all-reduce), `state` (the training state after the update); null for detectors that compare "
        "no figure")]

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(FAULT_KINDS)}")


class HeartbeatEvent(Event, tag="heartbeat", frozen=True, kw_only=True):
    """at least every second, from a background thread, also during long steps"""

    step: Annotated[int, _d("completed steps")]
    state: Annotated[str, _d(
        "`setup`, `calibrate`, `train`, `canary`, `partial-idle`, `idle`, `gemm`, `eval`, `done`, `collective` (a "
        "data-parallel rank waiting for its peers). A heartbeat whose `progress` does not change while `state` is "
        "a busy one means the main thread is stuck (for example in a GPU call that never returns)")]
    progress: Annotated[int, _d("completed units of work of any kind")]


class PhaseEvent(Event, tag="phase", frozen=True, kw_only=True):
    """mixed mode changed phase"""

    step: Annotated[int, _d("completed steps")]
    phase: Annotated[str, _d("`full`, `partial`, `idle`")]
    duration_s: Annotated[float, _d("how long the new phase lasts")]


class SegmentEvent(Event, tag="segment", frozen=True, kw_only=True):
    """`--reference-loop` restarted from the initial weights"""

    step: Annotated[int, _d("the last step of the pass that ended")]
    segment: Annotated[int, _d("the pass now starting, 2, 3, ...")]
    reference_steps: Annotated[int, _d("steps in one pass")]


class EndEvent(Event, tag="end", frozen=True, kw_only=True):
    """always the last line"""

    verdict: Annotated[str, _d("`pass`, `fail` (a fault) or `error` (usage, setup, internal, interrupted)")]
    reason: Annotated[str, _d("one line")]
    kind: Annotated[str | None, _d(
        "fail: the fault kind, as in `fault`; error: `" + "`, `".join(ERROR_KINDS) + "` (`peer`: a data-parallel "
        "peer died or stalled, not this rank's fault); null on a pass")]
    step: Annotated[int | None, _d("the failing step (fail)")]
    reference_step: Annotated[int | None, _d("the failing step's reference step, as in `fault`")]
    steps: Annotated[int, _d("steps (gemm rounds) completed")]
    duration_s: Annotated[float, _d("time since setup ended")]
    median_step_ms: Annotated[float | None, _d("over steps after warm-up (and not just after an idle gap)")]
    median_tok_s: Annotated[float | None, _d("over the same steps")]
    bpb: Annotated[float | None, _d("held-out bits per byte (pass only)")]
    eval_losses: Annotated[tuple[float, ...], _d(
        "held-out loss of each fixed window, nats per token, per byte for byte-level presets (pass only)")]
    reference: Annotated[ReferenceCompared | None, _d("the comparison with `--reference`; null: none ran")]
    recorded: Annotated[str | None, _d("the reference file written (pass with `--record`)")]
    sensitivity: Annotated[str | None, _d("`full` or `reduced` (`--tolerance`); null before the start-up check")]
    first_difference: Annotated[FirstDifference | None, _d(
        "the first step that did not repeat (`--verify-repeatable`, or the start-up check)")]
    setup_problems: Annotated[tuple[str, ...], _d("as in `start`")]
    warnings: Annotated[int, _d("`warning` events")]
    canaries: Annotated[int, _d("canary replays")]
    exit_code: Annotated[int, _d("the process's exit status: 0 pass, 1 fail; error: 2, 4 (torch, the engine "
                                 "extra, is not installed) or 130 (interrupted)")]
    figure: Annotated[str | None, _d("fail: the figure that differed, as in `fault`")]
    data_parallel: Annotated[DataParallelStatus | None, _d("data-parallel ranks; null for a single engine")]

    def __post_init__(self) -> None:
        codes = VERDICT_EXIT_CODES.get(self.verdict)
        if codes is None:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(VERDICT_EXIT_CODES)}")
        if self.exit_code not in codes:
            raise ValueError(f"exit code {self.exit_code} does not go with verdict {self.verdict!r}")
        if self.verdict == "fail" and self.kind not in FAULT_KINDS:
            raise ValueError(f"a fail's kind {self.kind!r} is not a fault kind")

    @classmethod
    def before_work(cls, reason: str, kind: str, exit_code: int, *, step: int | None = None, steps: int = 0,
                    duration_s: float = 0.0) -> EndEvent:
        """An `error` end with nothing measured: a usage error before setup, or the engine's last resort when
        building the full end failed."""
        return cls(verdict="error", reason=reason, kind=kind, step=step, reference_step=None, steps=steps,
                   duration_s=duration_s, median_step_ms=None, median_tok_s=None, bpb=None, eval_losses=(),
                   reference=None, recorded=None, sensitivity=None, first_difference=None, setup_problems=(),
                   warnings=0, canaries=0, exit_code=exit_code, figure=None, data_parallel=None)


ENGINE_EVENTS: tuple[type[Event], ...] = (StartEvent, StepEvent, GemmEvent, CanaryEvent, WarningEvent, FaultEvent,
                                          HeartbeatEvent, PhaseEvent, SegmentEvent, EndEvent)
BY_NAME: dict[str, type[Event]] = {str(cls.__struct_config__.tag): cls for cls in ENGINE_EVENTS}


# --- what a reader meets besides the engine's events ----------------------------------------------------------------


class UnknownEvent(Event, tag=False, frozen=True, kw_only=True):
    """Valid JSON with an event name this version does not declare (a newer engine): kept in `raw`, never an error."""


class InvalidEvent(Event, tag=False, frozen=True, kw_only=True):
    """A declared event whose fields do not follow this schema (`problem` says how): a bug, never a verdict."""

    problem: str = ""


class LogEvent(Event, tag=False, frozen=True, kw_only=True):
    """A stdout line that is not a protocol event (should not happen; kept, never raised)."""

    line: str = ""


_E = TypeVar("_E", bound=Event)


def _with_raw(event: _E, raw: dict[str, Any]) -> _E:
    msgspec.structs.force_setattr(event, "_raw", raw)
    return event


def decode_line(line: str) -> Event:
    """One protocol line -> a typed, frozen event. Never raises: anything else is a LogEvent, UnknownEvent or
    InvalidEvent (module docstring). Non-finite floats come back as floats."""
    text = line.strip()
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return LogEvent(t=math.nan, line=text)
    if not isinstance(raw, dict) or not isinstance(raw.get("event"), str):
        return LogEvent(t=math.nan, line=text)
    t = raw.get("t")
    t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else math.nan
    cls = BY_NAME.get(raw["event"])
    if cls is None:
        return _with_raw(UnknownEvent(t=t), raw)
    try:
        # lax: "NaN", "Infinity" and "-Infinity" become floats (as would "7" an int: `validate` is the strict check)
        event = msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as e:
        return _with_raw(InvalidEvent(t=t, problem=f"{raw['event']}: {e}"), raw)
    return _with_raw(event, raw)


# --- writing --------------------------------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _plain_str(value: Any) -> str:
    """A str subclass (torch's TorchVersion) is written as the str it is; anything else undeclared is an error."""
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"an event field holds a {type(value).__name__}, which the protocol does not declare")


def to_record(event: Event, t: float) -> dict[str, Any]:
    """The JSON object the engine writes for `event` at `t`: `event`, `t`, then every field in declared order."""
    fields = msgspec.to_builtins(event, enc_hook=_plain_str)
    fields.pop("t", None)
    name = fields.pop("event")
    return {"event": name, "t": t, **_json_safe(fields)}


# --- the strict check (tests, fakes) --------------------------------------------------------------------------------


def validate(record: dict[str, Any]) -> Event:
    """The event `record` is, exactly as this version's engine writes it; else ProtocolError. Stricter than
    `decode_line`: every declared field present (those that may be absent excepted), no undeclared field, no value
    that only a lax reading accepts (`"7"` for an int), non-finite floats only as the three strings."""
    if not isinstance(record, dict):
        raise ProtocolError(f"an event is a JSON object, not {type(record).__name__}")
    name = record.get("event")
    cls = BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError(f"unknown event {name!r}")
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ProtocolError(f"{name}: `t` must be seconds since start, got {t!r}")
    info = _struct_info(cls)
    declared = {f.encode_name for f in info.fields if f.name != "t"}
    missing = sorted(f.encode_name for f in info.fields if f.required and f.encode_name not in record)
    extra = sorted(set(record) - declared - {"event", "t"})
    problems = [f"{what} {', '.join(keys)}" for what, keys in (("missing", missing), ("undeclared", extra)) if keys]
    if problems:
        raise ProtocolError(f"{name}: " + "; ".join(problems))
    _no_raw_non_finite(record, cls.__name__)
    try:
        event = msgspec.convert(record, cls, strict=False)
    except msgspec.ValidationError as e:
        raise ProtocolError(f"{name}: {e}") from None
    again = to_record(event, t)
    for key, value in record.items():
        if key not in ("event", "t") and not _same(again.get(key), value):
            field_type = next(f.type for f in info.fields if f.encode_name == key)
            raise ProtocolError(f"{name}.{key}: {value!r} does not read back as declared ({_type_text(field_type)})")
    return _with_raw(event, record)


@functools.cache
def _struct_info(cls: type[Event]) -> msgspec.inspect.StructType:
    """An event type's fields, read once: `type_info` rebuilds them on every call, and the fakes validate every line
    they write (a fake rig's test makes thousands)."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return info


def _no_raw_non_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"{where}: a raw non-finite float (write it as \"NaN\", \"Infinity\", \"-Infinity\")")
    if isinstance(value, dict):
        for k, v in value.items():
            _no_raw_non_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for v in value:
            _no_raw_non_finite(v, where)


def _same(written: Any, given: Any) -> bool:
    """`given` (a value as read) is what the engine would write for it: nothing only a lax reading accepts."""
    if isinstance(written, bool) or isinstance(given, bool):
        return written is given
    if isinstance(written, dict):
        return isinstance(given, dict) and written.keys() == given.keys() and all(
            _same(written[k], given[k]) for k in written)
    if isinstance(written, list):
        return isinstance(given, list) and len(written) == len(given) and all(
            _same(w, g) for w, g in zip(written, given, strict=True))
    if isinstance(written, (int, float)) and isinstance(given, (int, float)):
        return written == given
    if isinstance(written, str) and isinstance(given, str):  # a StrEnum is written as its string
        return written == given
    return type(written) is type(given) and written == given


# --- the docs tables ------------------------------------------------------------------------------------------------


def _type_text(t: msgspec.inspect.Type) -> str:
    mi = msgspec.inspect
    if isinstance(t, mi.Metadata):
        return _type_text(t.type)
    if isinstance(t, mi.UnionType):
        parts = [_type_text(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return " or ".join(parts) + (" or null" if any(isinstance(x, mi.NoneType) for x in t.types) else "")
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        return f"list of {_type_text(t.item_type)}"
    if isinstance(t, (mi.DictType, mi.StructType)):
        return "object"
    simple = {mi.IntType: "int", mi.FloatType: "float", mi.StrType: "str", mi.BoolType: "bool", mi.AnyType: "any"}
    return simple.get(type(t), type(t).__name__)


def _meaning(field: msgspec.inspect.Field) -> str:
    t = field.type
    text = t.extra_json_schema.get("description", "") if isinstance(t, msgspec.inspect.Metadata) and \
        t.extra_json_schema else ""
    return text + ("" if field.required else " (absent otherwise)")


def _objects_in(t: msgspec.inspect.Type) -> list[msgspec.inspect.StructType]:
    mi = msgspec.inspect
    if isinstance(t, mi.Metadata):
        return _objects_in(t.type)
    if isinstance(t, mi.UnionType):
        return [s for x in t.types for s in _objects_in(x)]
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        return _objects_in(t.item_type)
    return [t] if isinstance(t, mi.StructType) else []


def _table(info: msgspec.inspect.StructType) -> list[str]:
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for f in info.fields:
        if f.name != "t":
            rows.append(f"| `{f.encode_name}` | {_type_text(f.type)} | {_meaning(f)} |")
    return rows


def markdown() -> str:
    """The event tables of docs/engine.md, from the declarations above."""
    out: list[str] = []
    for cls in ENGINE_EVENTS:
        info = _struct_info(cls)
        out += [f"### `{info.tag}`: {(cls.__doc__ or '').strip()}", *_table(info), *_object_tables(info, ""), ""]
    return "\n".join(out).rstrip() + "\n"


def _object_tables(info: msgspec.inspect.StructType, prefix: str) -> list[str]:
    """A table for each object field, after the table that names it (`data`, then `data.tokenizer`)."""
    out: list[str] = []
    for f in info.fields:
        for obj in _objects_in(f.type):
            path = f"{prefix}{f.encode_name}"
            out += ["", f"`{path}`:", "", *_table(obj), *_object_tables(obj, path + ".")]
    return out


DOCS_BEGIN = "<!-- event tables: generated by `python -m tuner.engine.events`; a test keeps them equal -->"
DOCS_END = "<!-- end of the event tables -->"

if __name__ == "__main__":
    sys.stdout.write(markdown())

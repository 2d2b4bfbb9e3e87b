"""What an engine run is asked to do: presets, injections, and the parsed command line. No torch here."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

MODES = ("train", "gemm", "mixed")
DTYPES = ("auto", "bf16", "fp16", "fp32")
_DTYPE_ALIASES = {
    "auto": "auto",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
}


class UsageProblem(Exception):
    """Bad input to the engine: one line on stderr, an `end` event with verdict `error`, exit 2."""


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape (`tuner.engine.model.GPT`)."""

    depth: int
    width: int
    head_dim: int
    seq_len: int
    vocab: int = 256  # 256: token = byte; larger: a BPE tokenizer trained on the corpus (tokenizer.py)
    window_pattern: str = "L"  # sliding-window pattern tiled over the layers ("L": full context everywhere)
    value_embeds: bool = False

    @property
    def n_head(self) -> int:
        return self.width // self.head_dim

    def windows(self) -> list[int]:
        """Each layer's attention window: how far back it may look, in tokens (`model.window_mask`)."""
        long_w = self.seq_len
        short_w = -(-long_w // 4 // 128) * 128  # nanochat: a quarter of the context, ceil to 128 (2048 -> 512)
        sizes = [short_w if self.window_pattern[i % len(self.window_pattern)] == "S" else long_w
                 for i in range(self.depth)]
        sizes[-1] = long_w
        return sizes

    def has_ve(self, layer: int) -> bool:
        """nanochat's `has_ve`: alternate layers, the last one always."""
        return self.value_embeds and layer % 2 == (self.depth - 1) % 2


@dataclass(frozen=True, kw_only=True)
class Preset(GPTConfig):
    """A model shape and the batch it tries first (the batch auto-fit may step it down)."""

    name: str
    batch_size: int
    canary_batch: int  # rows of the canary's fixed batch (at most batch_size)
    eval_windows: int  # fixed held-out windows scored at the end
    warmup_steps: int  # default steps excluded from throughput medians and soft signals
    lr_scale: float = 1.0  # multiplies every learning rate
    bf16_embeddings: bool = False  # token and value embeddings stored in the compute dtype, as nanochat does
    weight_decay: float = 0.0  # Muon's (cautious) weight decay
    lr_warmup_steps: int = 0  # learning rates rise linearly over these optimizer steps
    momentum_warmup_steps: int = 0  # Muon momentum 0.85 -> 0.95 over these steps
    target_tokens: int = 0  # on a GPU the batch doubles while tokens/step stay at most this (0: never grows)
    embedding_lr: float = 0.2  # AdamW learning rate of the token (and value) embeddings, before width scaling

    @property
    def bpe(self) -> bool:
        return self.vocab != 256


PRESETS: dict[str, Preset] = {
    # The load that matters (the default on GPUs): nanochat's depth-6 model as nanochat builds it today
    # (model_dim = depth x 64 rounded up to head dim 128 -> 384, 3 heads), vocabulary 32,768 (BPE), 2,048
    # tokens, value embeddings, "SSSL" windows, bf16 embeddings, Muon with its momentum warm-up, weight decay 0.2,
    # embedding lr 0.3. ~168 M FLOPs per token, the head 54 % of the matmul FLOPs. The batch grows on a GPU up to
    # nanochat's own batch for depth 6 (262,144 tokens per optimizer step), memory permitting.
    "nanochat": Preset(name="nanochat", depth=6, width=384, head_dim=128, seq_len=2048, batch_size=8,
                       canary_batch=2, eval_windows=4, warmup_steps=20, vocab=32768, window_pattern="SSSL",
                       value_embeds=True, bf16_embeddings=True, weight_decay=0.2, lr_warmup_steps=0,
                       momentum_warmup_steps=300, target_tokens=2**18, embedding_lr=0.3),
    # CPU and tests: ~0.13 M parameters, 512 tokens a step, a few ms a step.
    "tiny": Preset(name="tiny", depth=2, width=64, head_dim=32, seq_len=64, batch_size=8, canary_batch=8,
                   eval_windows=8, warmup_steps=5),
    # Byte-level depth 6 at 512 tokens: a light load for small or shared GPUs (about half nanochat's FLOPs per
    # token, no 32,768-wide head); the batch grows on a GPU up to 131,072 tokens per step.
    "small": Preset(name="small", depth=6, width=384, head_dim=64, seq_len=512, batch_size=32, canary_batch=8,
                    eval_windows=16, warmup_steps=20, target_tokens=2**17),
    # Depth 12, width 768 (nanochat d12's trunk) at 2,048 tokens, byte-level: the most trunk FLOPs per token
    # for a big GPU; the batch grows up to 524,288 tokens per step (or memory).
    "large": Preset(name="large", depth=12, width=768, head_dim=128, seq_len=2048, batch_size=64, canary_batch=4,
                    eval_windows=16, warmup_steps=20, target_tokens=2**19),
}

GPU_DEFAULT_PRESET = "nanochat"
CPU_DEFAULT_PRESET = "tiny"


def default_preset(device: str) -> str:
    """`nanochat` on GPUs (the load that matters), `tiny` on the CPU and MPS."""
    return GPU_DEFAULT_PRESET if re.fullmatch(r"(cuda|hip)(:\d+)?", device) else CPU_DEFAULT_PRESET


_RENDEZVOUS_RE = re.compile(r"^(file://(/.+)|tcp://([^:/\s]+):(\d{1,5}))$")


def rendezvous_problem(url: str) -> str | None:
    """Why `url` is not a data-parallel rendezvous the engine accepts, or None.

    >>> rendezvous_problem("file:///tmp/rdv") is None, rendezvous_problem("tcp://127.0.0.1:29500") is None
    (True, True)
    >>> rendezvous_problem("127.0.0.1:29500")
    "bad --rendezvous '127.0.0.1:29500': use file:///PATH (a file every rank can reach) or tcp://HOST:PORT"
    """
    m = _RENDEZVOUS_RE.match(url)
    if m and (m.group(4) is None or 0 < int(m.group(4)) < 65536):
        return None
    return f"bad --rendezvous {url!r}: use file:///PATH (a file every rank can reach) or tcp://HOST:PORT"


_INJECT_RE = re.compile(r"^(bitflip|nan|hang)@(\d+)(?::(weight|activation))?(?::(\d+))?$")


@dataclass(frozen=True)
class Injection:
    """`bitflip@STEP[:weight|activation][:BIT]`, `nan@STEP`, `hang@STEP`. Steps count from 1."""

    kind: str
    step: int
    target: str = "weight"
    bit: int | None = None

    @classmethod
    def parse(cls, text: str) -> Injection:
        m = _INJECT_RE.match(text.strip())
        if not m:
            raise UsageProblem(
                f"bad --inject {text!r}: expected bitflip@STEP[:weight|activation][:BIT], nan@STEP or hang@STEP"
            )
        kind, step, target, bit = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if step < 1:
            raise UsageProblem(f"bad --inject {text!r}: steps count from 1")
        if kind != "bitflip" and (target or bit):
            raise UsageProblem(f"bad --inject {text!r}: only bitflip takes a target and a bit")
        if bit is not None and not 0 <= int(bit) <= 31:
            raise UsageProblem(f"bad --inject {text!r}: bit must be 0..31")
        return cls(kind, step, target or ("activation" if kind == "nan" else "weight"),
                   None if bit is None else int(bit))

    def __str__(self) -> str:
        if self.kind != "bitflip":
            return f"{self.kind}@{self.step}"
        return f"bitflip@{self.step}:{self.target}" + ("" if self.bit is None else f":{self.bit}")


def _option(default: Any, text: str, /, **argparse_kwargs: Any) -> Any:
    """A field of EngineOptions declared with its command-line option (`build_parser`): the flag is `--NAME`
    from the field's name unless `flag` says otherwise; `text` is the help; `argparse_kwargs` go to
    `add_argument` (a `default` there is the command line's own, where it differs from the field's)."""
    return field(default=default, metadata={"option": {"help": text, **argparse_kwargs}})


@dataclass
class EngineOptions:
    """Everything the command line sets, each field with its option: one declaration, in the order of `--help`.
    Tests build this directly to run the engine in-process."""

    device: str = _option("cpu", "cuda:N, cpu or mps (default cpu)")
    preset: str = _option("tiny", "model shape (default nanochat on GPUs, tiny on the CPU and MPS)", default=None,
                          choices=list(PRESETS))
    mode: str = _option("train", "train (default), gemm (GEMM burn only) or mixed (partial-load phases and idle gaps)",
                        choices=list(MODES))
    steps: int | None = _option(None, "stop after N steps (gemm mode: N GEMM rounds)", type=int, metavar="N")
    duration_s: float | None = _option(None, "stop after TIME: seconds, or 90s / 5m / 1h", flag="--duration",
                                       metavar="TIME")
    seed: int = _option(0, "model init and data order (default 0)", type=int)
    fault_seed: int | None = _option(None, "seed of the fault-injection draws (default: --seed); the training data "
                                     "and weights, and so the reference trajectory, depend on --seed only",
                                     type=int, metavar="N")
    dtype: str = _option("auto", "compute dtype: auto (default; bf16 where supported, else fp32), bf16, fp16, fp32; "
                         "else $TUNER_DTYPE", default=None)
    batch_size: int | None = _option(None, "sequences per step (default: preset, auto-fit)", type=int, metavar="B")
    warmup_steps: int | None = _option(None, "steps left out of throughput medians", type=int, metavar="N")
    data: str | None = _option(None, "train on these files (a file or a directory) instead of the running Python's "
                               "standard library sources", metavar="PATH")
    record: str | None = _option(None, "save per-step digests as a reference trajectory", metavar="PATH")
    reference: str | None = _option(None, "compare every step with this recorded trajectory", metavar="PATH")
    reference_loop: bool = _option(False, "past the reference's end, restart training from the initial weights "
                                   "(same batches) and keep comparing, so a run of any length is compared at every "
                                   "step", action="store_true")
    canary_every: int = _option(100, "canary replay every K steps (default 100; 0 = off)", type=int, metavar="K")
    canary_every_s: float = _option(60.0, "also a canary when S seconds passed since the last (default 60; 0 = off)",
                                    type=float, metavar="S")
    gemm_n: int | None = _option(None, "GEMM check matrix side (default: sized to device)", type=int, metavar="N")
    gemm_repeats: int = _option(4, "GEMMs per check (default 4)", type=int, metavar="R")
    threads: int | None = _option(None, "CPU threads for torch (default: torch's)", type=int, metavar="N")
    expect_pci_bus_id: str | None = _option(None, "fail setup unless the GPU used has this PCI bus id (e.g. "
                                            "0000:03:00.0)", metavar="BUSID")
    fault_rate: float = _option(0.0, "per-step probability of one silent bit flip (simulated GPU and tests)",
                                type=float, metavar="P")
    injections: list[Injection] = field(default_factory=list, metadata={"option": {
        "flag": "--inject", "action": "append", "default": [], "metavar": "FAULT",
        "help": "bitflip@STEP[:weight|activation][:BIT], nan@STEP or hang@STEP (repeatable)"}})
    # mixed mode: full load, then duty-cycled partial load, then an idle gap, repeated
    mixed_full_s: float = _option(126.0, "mixed: full-load phase", type=float, metavar="S")
    mixed_partial_s: float = _option(36.0, "mixed: partial-load phase", type=float, metavar="S")
    idle_gap_s: float = _option(12.0, "mixed: idle gap (default 12)", type=float, metavar="S")
    partial_duty: float = _option(0.5, "mixed: busy fraction in the partial-load phase (default 0.5)", type=float,
                                  metavar="F")
    heartbeat_s: float = _option(0.5, "heartbeat interval (default 0.5)", type=float, metavar="S")
    tolerance: bool = _option(False, "compare with tolerances instead of bit for bit (reduced sensitivity: catches "
                              "far fewer faults); only on request, never automatic", action="store_true")
    reference_tolerance: float = _option(0.05, "relative loss tolerance with --tolerance (default 0.05)", type=float,
                                         metavar="REL")
    verify_repeatable: bool = _option(False, "with --reference: replay it at stock and record in the file whether it "
                                      "repeats bit for bit (and the first differing step); a difference ends the run "
                                      "with kind not-repeatable", action="store_true")
    # simulated platform flaws (the simulated GPU; tuner/engine/faults.py): runs never repeat bit for bit, or stop
    # repeating from this wall-clock time (seconds since the epoch) on
    sim_nondeterministic: bool = _option(False, argparse.SUPPRESS, action="store_true")
    sim_contention_at: float | None = _option(None, argparse.SUPPRESS, type=float)
    parent_pid: int | None = _option(None, "end (exit 130) when this process is gone (default: the parent at "
                                     "start-up; the stress client passes its own pid)", type=int, metavar="PID")
    compile: bool | None = _option(None, "torch.compile the model and the optimizer updates (default: on for GPUs, "
                                   "off on the CPU)", action=argparse.BooleanOptionalAction)
    cache_dir: str | None = _option(None, "where the tokenizer and compiled kernels are cached (default "
                                    "$XDG_CACHE_HOME/tuner)", metavar="DIR")
    # data-parallel ranks (tuner/engine/distributed.py): one engine per device, gradients all-reduced every step
    world_size: int = _option(1, "data-parallel: N engines (ranks), one per device, gradients all-reduced every "
                              "step (default 1: no collectives)", type=int, metavar="N")
    rank: int = _option(0, "data-parallel: this engine's rank, 0..N-1", type=int, metavar="R")
    rendezvous: str | None = _option(None, "data-parallel: where the ranks meet, file:///PATH or tcp://HOST:PORT (the "
                                     "same for all)", metavar="URL")
    collective_timeout_s: float = _option(60.0, "data-parallel: a collective (or the group's forming) waiting longer "
                                          "than S seconds means a peer died or stalled; this rank ends with kind peer "
                                          "(default 60)", type=float, metavar="S")
    # test hooks (hidden on the command line): simulate out-of-memory for any batch larger than this, or once, at
    # this step
    test_oom_above: int | None = _option(None, argparse.SUPPRESS, type=int)
    test_oom_at_step: int | None = _option(None, argparse.SUPPRESS, type=int)

    @property
    def preset_spec(self) -> Preset:
        return PRESETS[self.preset]

    def validate(self) -> None:
        if self.preset not in PRESETS:
            raise UsageProblem(f"unknown preset {self.preset!r}: choose one of {', '.join(PRESETS)}")
        if self.mode not in MODES:
            raise UsageProblem(f"unknown mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise UsageProblem(f"unknown dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.steps is None and self.duration_s is None:
            raise UsageProblem("nothing bounds the run: give --steps N or --duration (e.g. 90s, 5m, 1h)")
        if self.steps is not None and self.steps < 1:
            raise UsageProblem(f"--steps must be at least 1, got {self.steps}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise UsageProblem(f"--duration must be positive, got {self.duration_s}")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise UsageProblem(f"--fault-rate must be between 0 and 1, got {self.fault_rate}")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageProblem(f"--batch-size must be at least 1, got {self.batch_size}")
        # each float bound below is written so that NaN fails it (NaN compares false both ways)
        if not (self.canary_every >= 0 and self.canary_every_s >= 0):
            raise UsageProblem("--canary-every and --canary-every-s must be 0 or more (0 = off)")
        if self.gemm_n is not None and self.gemm_n < 8:
            raise UsageProblem(f"--gemm-n must be at least 8, got {self.gemm_n}")
        if self.gemm_repeats < 2:
            raise UsageProblem(f"--gemm-repeats must be at least 2, got {self.gemm_repeats}")
        if not (self.mixed_full_s > 0 and self.mixed_partial_s >= 0 and self.idle_gap_s >= 0):
            raise UsageProblem("mixed-mode phase lengths: --mixed-full-s must be > 0, --mixed-partial-s and "
                               "--idle-gap-s 0 or more")
        if not 0.05 <= self.partial_duty <= 1.0:
            raise UsageProblem(f"--partial-duty must be in 0.05..1, got {self.partial_duty}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise UsageProblem("--warmup-steps must not be negative")
        if not 0 < self.heartbeat_s <= 1.0:
            raise UsageProblem("--heartbeat-s must be in (0, 1]")
        if self.parent_pid is not None and self.parent_pid < 1:
            raise UsageProblem(f"--parent-pid must be a process id, got {self.parent_pid}")
        if self.threads is not None and self.threads < 1:
            raise UsageProblem("--threads must be at least 1")
        if self.record and self.reference and os.path.abspath(self.record) == os.path.abspath(self.reference):
            raise UsageProblem("--record and --reference must be different files")
        if not re.fullmatch(r"cpu|mps|(cuda|hip)(:\d+)?", self.device):
            raise UsageProblem(f"bad --device {self.device!r}: use cuda:N, cpu or mps")
        if self.reference_loop and (not self.reference or self.record):
            raise UsageProblem("--reference-loop needs --reference and cannot be combined with --record")
        if self.verify_repeatable and (not self.reference or self.record or self.reference_loop):
            raise UsageProblem("--verify-repeatable needs --reference and excludes --record and --reference-loop")
        if not self.reference_tolerance > 0:
            raise UsageProblem(f"--reference-tolerance must be positive, got {self.reference_tolerance}")
        if self.compile and (self.injections or self.fault_rate > 0):
            raise UsageProblem("--compile cannot be combined with --inject/--fault-rate (injections hook eager "
                               "modules); use --no-compile")
        if self.mode == "gemm" and (self.record or self.reference):
            raise UsageProblem("--record/--reference need a training mode (train or mixed), not gemm")
        self._validate_data_parallel()

    def _validate_data_parallel(self) -> None:
        if self.world_size < 1:
            raise UsageProblem(f"--world-size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise UsageProblem(f"--rank must be in 0..{self.world_size - 1} for --world-size {self.world_size}, "
                               f"got {self.rank}")
        if self.world_size > 1 and not self.rendezvous:
            raise UsageProblem(f"--world-size {self.world_size} needs --rendezvous file:///PATH or tcp://HOST:PORT "
                               "(the same for every rank)")
        if self.rendezvous and self.world_size == 1:
            raise UsageProblem("--rendezvous needs --world-size 2 or more")
        if self.rendezvous and (problem := rendezvous_problem(self.rendezvous)):
            raise UsageProblem(problem)
        if not self.collective_timeout_s > 0:
            raise UsageProblem(f"--collective-timeout-s must be positive, got {self.collective_timeout_s}")
        if self.world_size > 1 and self.device == "mps":
            raise UsageProblem("--world-size: data-parallel runs need cpu (gloo) or cuda:N (nccl/rccl), not mps")

    @property
    def effective_fault_seed(self) -> int:
        return self.seed if self.fault_seed is None else self.fault_seed

    def compile_enabled(self, device_type: str) -> bool:
        """--compile / --no-compile, else on for GPUs (not with fault injection) and off on the CPU and MPS."""
        if self.compile is not None:
            return self.compile
        return device_type == "cuda" and not (self.injections or self.fault_rate > 0)

    @property
    def effective_warmup_steps(self) -> int:
        return self.preset_spec.warmup_steps if self.warmup_steps is None else self.warmup_steps


def parse_dtype(text: str) -> str:
    key = text.strip().lower()
    if key not in _DTYPE_ALIASES:
        raise UsageProblem(f"unknown dtype {text!r}: use bf16, fp16, fp32 or auto")
    return _DTYPE_ALIASES[key]


def parse_duration_s(text: str) -> float:
    """`90`, `90s`, `5m`, `1h`, `1h30m` -> seconds (the project's own parser, errors made engine-local)."""
    from tuner.core.durations import parse_duration_s as parse
    from tuner.core.errors import UsageError

    try:
        return parse(text)
    except UsageError as e:
        raise UsageProblem(f"bad --duration: {e.one_line()}") from None


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageProblem(message)


def build_parser() -> argparse.ArgumentParser:
    p = _ArgParser(
        prog="python -m tuner.engine",
        description="Stress a device with a small nanochat-style training run and check every step for "
        "miscomputation. JSON lines on stdout (docs/engine.md), logs on stderr. "
        "Exit 0 pass, 1 fault detected, 2 usage or setup error, 130 interrupted.",
    )
    for f in fields(EngineOptions):
        option = {"default": f.default, **f.metadata["option"]}
        p.add_argument(option.pop("flag", "--" + f.name.replace("_", "-")), dest=f.name, **option)
    return p


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> EngineOptions:
    """Command line (and $TUNER_DTYPE) -> validated options. Raises UsageProblem."""
    env = os.environ if environ is None else environ
    a = build_parser().parse_args(argv)
    dtype = parse_dtype(a.dtype if a.dtype is not None else env.get("TUNER_DTYPE") or "auto")
    # each option sets the EngineOptions field it is declared with; these four are converted first
    given = vars(a) | {"preset": a.preset or default_preset(a.device), "dtype": dtype,
                       "duration_s": None if a.duration_s is None else parse_duration_s(a.duration_s),
                       "injections": [Injection.parse(s) for s in a.injections]}
    opts = EngineOptions(**given)
    opts.validate()
    return opts


# --- options -> command line (the stress client launches the engine with this) ----------------------------


def _render(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)  # repr: the float parses back bit for bit


def to_argv(opts: EngineOptions) -> list[str]:
    """The command line that `parse_args` turns back into `opts`, rendered from the parser's own declarations
    (one declaration of each option). Only options that differ from their EngineOptions default are written;
    a dtype of "auto" is left out, so the engine's $TUNER_DTYPE still applies. Each value is one `--flag=value`
    token, so a negative number or a value starting with "-" is never read as an option.

    >>> to_argv(EngineOptions(steps=5, fault_seed=-50, injections=[Injection("hang", 3)]))
    ['--preset=tiny', '--steps=5', '--fault-seed=-50', '--inject=hang@3']
    >>> to_argv(EngineOptions(preset="nanochat", steps=1, compile=False))
    ['--preset=nanochat', '--steps=1', '--no-compile']
    """
    defaults = EngineOptions()
    argv: list[str] = []
    for action in build_parser()._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        name = action.dest
        value = getattr(opts, name)
        # the preset is always written: the command line's default depends on the device (nanochat on GPUs)
        if value == getattr(defaults, name) and name != "preset":
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        elif isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(action, argparse._AppendAction):
            argv += [f"{flag}={_render(item)}" for item in value]
        else:
            argv.append(f"{flag}={_render(value)}")
    return argv


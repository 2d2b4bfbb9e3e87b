"""The engine run: set up, train (or burn GEMMs), check every step, report, and end with a verdict.

`Engine(options, emitter).run()` returns the exit code (0 pass, 1 fault, 2 usage/setup error, 130
interrupted) after emitting `end`. Tests and benchmarks may also call `setup()` and `step_once()` directly.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import torch
from msgspec import UNSET

from tuner.core.errors import first_line
from tuner.engine import attention, compiled
from tuner.engine.batchfit import BatchDoesNotFit, fit_batch
from tuner.engine.data import DataProblem, WindowSampler, load_corpus, tokenize
from tuner.engine.detectors import (
    CanaryReplay,
    Finding,
    GemmCheck,
    NonFiniteDetector,
    ReferenceTrajectory,
    SoftSignals,
    TrajectoryRecorder,
    bit_checksum,
    device_error,
    first_differing,
)
from tuner.engine.distributed import DataParallel, GroupDidNotForm, PeerLost, data_seed
from tuner.engine.environment import kernel_env
from tuner.engine.events import (
    PROTOCOL_VERSION,
    CanaryEvent,
    DataParallelStatus,
    DataSource,
    EndEvent,
    FaultEvent,
    FirstDifference,
    GemmEvent,
    ModelShape,
    PhaseEvent,
    ReferenceCompared,
    ReferenceInUse,
    SegmentEvent,
    StartEvent,
    StepEvent,
    TokenizerInfo,
    WarningEvent,
)
from tuner.engine.faults import FaultInjector, PlatformFlaw
from tuner.engine.lifeline import PARENT_EXIT, parent_alive
from tuner.engine.model import GPT
from tuner.engine.optim import build_optimizers, eager_updates
from tuner.engine.options import EngineOptions, UsageProblem
from tuner.engine.platform import (
    DTYPE_NAMES,
    SetupProblem,
    choose_dtype,
    choose_kernels,
    default_gemm_n,
    deterministic_mode,
    driver_version,
    empty_cache,
    enable_determinism,
    is_oom,
    make_oom,
    resolve_device,
    same_bus_id,
    sdpa_backend,
    synchronize,
    versions,
    visibility_env,
)
from tuner.engine.protocol import Emitter, Heartbeat, log_line
from tuner.engine.reference import (
    MISMATCH,
    Reference,
    ReferenceProblem,
    f32_from_bits,
    fingerprint_diff,
    load_reference,
    mark_repeatability,
    save_reference,
    step_digest,
)
from tuner.engine.tokenizer import BpeTokenizer, TokenizerProblem, load_or_train

EXIT_PASS, EXIT_FAULT, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
PHASE_CODES = {"full": 1, "partial": 2, "idle": 3}  # mixed-mode phases in the ranks' agreement (0: none)
PHASE_NAMES = {code: name for name, code in PHASE_CODES.items()}
REPEATABILITY_RUNS = 2
CHECK_STEPS = 2  # real training steps, at the training shape, in each half of the start-up repeatability check
NOT_DETERMINISTIC = "does not have a deterministic implementation"  # torch's strict-mode error
NOT_REPEATABLE_HELP = ("likely causes: a kernel that is not deterministic on this platform (see `kernels` in the "
                       "start event), or another process using the GPU (a display, a second job); remedies: stop "
                       "other GPU work, update the driver and PyTorch, or opt in to the weaker comparison with "
                       "--tolerance (reduced sensitivity)")
PARENT_GRACE_S = 3.0  # after the parent died, how long the main thread gets to stop before the process exits


class _End(Exception):
    """Ends the run: carries the verdict to `run()`."""

    def __init__(self, verdict: str, reason: str, kind: str | None = None, step: int | None = None,
                 exit_code: int = EXIT_ERROR) -> None:
        super().__init__(reason)
        self.verdict, self.reason, self.kind, self.step, self.exit_code = verdict, reason, kind, step, exit_code


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    dt_s: float
    tokens: int
    param_sum: int | None = None  # bit checksum of every parameter after the update
    grad_sum: int | None = None  # data-parallel: bit checksum of this rank's own gradients, before the all-reduce


def mixed_phase(o: EngineOptions, elapsed_s: float) -> tuple[str, float]:
    """Mixed mode: full load, then partial (duty-cycled) load, then an idle gap, repeated; time-based. The phase
    `elapsed_s` into the loop, and the seconds left in it."""
    cycle = o.mixed_full_s + o.mixed_partial_s + o.idle_gap_s
    pos = elapsed_s % cycle
    if pos < o.mixed_full_s:
        return "full", o.mixed_full_s - pos
    if pos < o.mixed_full_s + o.mixed_partial_s:
        return "partial", o.mixed_full_s + o.mixed_partial_s - pos
    return "idle", cycle - pos


class Engine:
    train_model: Callable[..., torch.Tensor]  # the model (eager) or its compiled wrapper: what a training step runs

    def __init__(self, opts: EngineOptions, emitter: Emitter, *, log: Callable[[str], None] = log_line,
                 sleep: Callable[[float], None] = time.sleep, environment_notes: list[str] | None = None) -> None:
        self.opts, self.em, self.log, self.sleep = opts, emitter, log, sleep
        # what `compiled.prepare_environment()` overrode when the CLI called it, before torch was imported
        self.environment_notes = list(environment_notes or [])
        self.state = "setup"
        self.step = 0  # completed training steps (gemm mode: completed GEMM rounds)
        self.progress = 0  # completed units of work of any kind (steps, canaries, GEMM rounds)
        self.stop_signal: str | None = None
        self.setup_problems: list[str] = []
        self.warning_count = 0
        self.canary_count = 0
        self.step_times: list[float] = []  # steady steps only
        self.tok_s: list[float] = []
        self.heartbeat: Heartbeat | None = None
        self.injector = FaultInjector(opts.injections, opts.fault_rate, opts.effective_fault_seed, log=log,
                                      flaw=PlatformFlaw(opts.sim_nondeterministic, opts.sim_contention_at))
        self.kernels: dict = {}
        self.attention_kernels: list[str] = []  # one per layer (attention.layer_kernels); none in gemm mode
        self.first_difference: FirstDifference | None = None  # the first step (0: start-up check) that did not repeat
        self.bitwise_probe: ReferenceTrajectory | None = None  # --verify-repeatable with --tolerance
        self.reference: Reference | None = None
        self.trajectory: ReferenceTrajectory | None = None
        self.recorder = TrajectoryRecorder() if opts.record else None
        self.nonfinite = NonFiniteDetector()
        self.soft = SoftSignals()
        self.repeatable: bool | None = None
        self.repeatability: dict = {}
        self.oom_at_step_pending = opts.test_oom_at_step
        self._last_canary_t = 0.0
        self._canary_pending: str | None = None
        self._steps_since_idle = 10**9
        self._phase = "full"
        self._loop_start = 0.0
        self._setup_done = False
        self.segment = 1
        self._parent_gone_at: float | None = None
        self.dp: DataParallel | None = None  # data-parallel ranks (--world-size > 1): the process group
        self._dp_sync = False  # gradients are all-reduced only in the loop (the start-up checks stay local)
        self._state_outside_collective = "setup"
        self.fault_figure: str | None = None  # the figure the failing check compared ("loss", "state", ...)

    # --- heartbeat ------------------------------------------------------------------------------------------

    def heartbeat_status(self) -> dict:
        return {"step": self.step, "state": self.state, "progress": self.progress}

    def watch_parent(self) -> None:
        """From the heartbeat thread (and once at start): when the process that started the engine is gone, stop
        as on SIGTERM; if the main thread has not ended PARENT_GRACE_S later (stuck in a long call), exit."""
        if parent_alive(self.opts.parent_pid):
            return
        now = time.monotonic()
        if self._parent_gone_at is None:
            self._parent_gone_at = now
            self.stop_signal = self.stop_signal or PARENT_EXIT
            self.log("the process that started the engine has exited: stopping")
        elif now - self._parent_gone_at >= PARENT_GRACE_S:
            self.log(f"still running {PARENT_GRACE_S:g} s after the parent exited: exiting now")
            os._exit(EXIT_INTERRUPTED)

    # --- setup ----------------------------------------------------------------------------------------------

    def setup(self) -> None:
        opts = self.opts
        opts.validate()
        self.cache_root = compiled.cache_root(opts.cache_dir)
        # the CLI's notes (it prepared the environment before torch was imported), or an in-process run's, here
        for line in [*self.environment_notes, *compiled.prepare_environment(self.cache_root)]:
            self._setup_warning("environment", line)
        if opts.threads:
            torch.set_num_threads(opts.threads)
        elif opts.device == "cpu" and opts.preset == "tiny":
            torch.set_num_threads(1)  # its matmuls are too small to gain from threads; shared CPUs lose a lot
        enable_determinism()
        self.spec = resolve_device(opts.device, opts.expect_pci_bus_id)
        self.kernels = choose_kernels(self.spec)
        expected, bus = opts.expect_pci_bus_id, self.spec.pci_bus_id  # bus: None on the CPU and MPS
        if expected and not (bus and same_bus_id(bus, expected)):  # resolve_device's own comparison
            raise SetupProblem(f"--device {opts.device} is {self.spec.name} at PCI {bus}, not the "
                               f"expected {expected} (check CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES)")
        self.dtype = choose_dtype(opts.dtype, self.spec)
        self.device = self.spec.device
        if opts.world_size > 1:
            self._join_group()
        self.gemm = GemmCheck(opts.gemm_n or default_gemm_n(self.spec), self.dtype, self.device, opts.gemm_repeats)
        p = opts.preset_spec
        self.tokenizer: BpeTokenizer | None = None
        self.token_bytes: torch.Tensor | None = None  # UTF-8 bytes per token id (BPE presets), for bits per byte
        self.use_compile = opts.mode != "gemm" and opts.compile_enabled(self.spec.type)
        self.compiled_fit = False  # the batch was one only the compiled step fits (the fit's compiled probe)
        if self.use_compile and self.spec.type == "cpu" and compiled.cpu_compile_problem():
            raise SetupProblem(f"--compile: {compiled.cpu_compile_problem()}")
        if opts.mode != "gemm":
            self.corpus = load_corpus(opts.data)
            if p.bpe:
                self._tokenize(p.vocab)
            self.sampler = WindowSampler(self.corpus, p.seq_len, data_seed(opts.seed, opts.rank))
            if opts.reference:
                self.reference = load_reference(opts.reference)
            self._build_model()
            self._attention_repeatable = self._attention_smoke()  # before the batch fit: a clearer error
            self.batch_size = self._fit_batch()
            if self.use_compile and self.train_model is self.model:  # the fit's probes ran eager kernels only
                self.train_model = compiled.compile_model(self.model)
            self._build_canary()
        else:
            self.batch_size = 0
        self._check_repeatability()
        if opts.mode != "gemm":
            self._compile_fallback()
            self._attach_reference()
        self._setup_done = True
        self._emit_start()
        self._enforce_repeatability()
        self._check_reference_canary()

    def _join_group(self) -> None:
        """Form the data-parallel group early (before the model): a rank that never arrives is a setup error
        within --collective-timeout-s, before anything long runs."""
        o = self.opts
        assert o.rendezvous is not None  # validated
        self.dp = DataParallel(o.world_size, o.rank, o.rendezvous, o.collective_timeout_s, self.device,
                               self.spec.type, set_state=self._collective_state)
        try:
            self.dp.init()
        except GroupDidNotForm as e:
            raise SetupProblem(str(e)) from None
        self.log(f"data-parallel: rank {o.rank} of {o.world_size} ({self.dp.library})")

    def _collective_state(self, state: str | None) -> None:
        """The heartbeat's state while this rank waits for its peers ("collective"), and back."""
        if state is not None:
            self._state_outside_collective = self.state
            self.state = state
        else:
            self.state = self._state_outside_collective

    def _tokenize(self, vocab: int) -> None:
        """BPE presets: the tokenizer learnt on this corpus (cached), then the corpus as tokens."""
        try:
            self.tokenizer = load_or_train(self.corpus.text(), self.corpus.sha256, vocab, self.cache_root,
                                           log=self.log)
        except TokenizerProblem as e:
            raise SetupProblem(str(e)) from None
        self.corpus = tokenize(self.corpus, self.tokenizer)
        self.token_bytes = self.tokenizer.token_bytes(vocab)

    def _build_model(self) -> None:
        gen = torch.Generator().manual_seed(self.opts.seed)
        p = self.opts.preset_spec
        # nanochat stores the embeddings in the compute dtype (fp32 when computing in fp16: no loss scaling)
        embed_dtype = self.dtype if p.bf16_embeddings and self.dtype != torch.float16 else torch.float32
        where = attention.attention_platform(self.spec.type, self.device, self.dtype, p.n_head, p.head_dim,
                                             p.seq_len)
        self.attention_kernels = attention.layer_kernels(p.windows(), p.seq_len, where)
        model = GPT(p, self.dtype, embed_dtype=embed_dtype, attention_kernels=self.attention_kernels)
        model.init_weights(gen)
        self.model = model.to(self.device)
        self.flat_params = self.model.flatten_parameters_()
        self.params = list(self.model.parameters())
        self.initial_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self._new_optimizers()
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.flops_per_token = self.model.flops_per_token()
        eager_updates()  # the batch fit's probes run eager kernels; compiled ones are swapped in after it
        self.train_model = self.model

    def _new_optimizers(self) -> None:
        p = self.opts.preset_spec
        ns_dtype = self.dtype if self.spec.type == "cuda" else torch.float32
        self.muon, self.adam = build_optimizers(self.model, lr_scale=p.lr_scale, ns_dtype=ns_dtype,
                                                weight_decay=p.weight_decay, lr_warmup_steps=p.lr_warmup_steps,
                                                momentum_warmup_steps=p.momentum_warmup_steps,
                                                embedding_lr=p.embedding_lr)

    def _restore_initial(self) -> None:
        """Initial weights and fresh optimizers (after a probe, a proof, or at a --reference-loop restart)."""
        self.model.zero_grad(set_to_none=True)
        self.model.load_state_dict(self.initial_state)
        self._new_optimizers()

    def _compile_fallback(self) -> None:
        """Compiling happens in the start-up check's training steps (setup time). With compile on by default
        (no --compile), compiled steps that do not repeat bit for bit fall back to eager kernels with a setup
        warning and the check runs again; an explicit --compile is held to the check like any other kernel."""
        if not self.use_compile:
            return  # `compiled` appears in `repeatability` only when compile was on
        steps_ok = self.repeatability.get("steps")
        if steps_ok is False and self.opts.compile is None:
            self.use_compile = False
            self.train_model = self.model
            eager_updates()
            self._setup_warning("compile", "two compiled training steps from the same start differed: running eager "
                                           "kernels (compile is on by default only where it repeats)")
            if self.compiled_fit:  # a batch only the compiled step fits: the eager kernels get one they fit
                torch._dynamo.reset()
                self.batch_size = self._fit_batch(eager_only=True)
                self._build_canary()
            self.first_difference = None
            self._check_repeatability()
        self.repeatability["compiled"] = bool(self.use_compile and self.repeatability.get("steps"))

    def _build_canary(self) -> None:
        canary_model = copy.deepcopy(self.model)
        canary_model.load_state_dict(self.initial_state)
        rows = max(1, min(self.opts.preset_spec.canary_batch, self.batch_size))
        x, y = self.sampler.fixed_batch(0, rows)
        self.canary = CanaryReplay(canary_model, x.to(self.device), y.to(self.device))

    def _oom_probe(self, batch: int, model: Callable[..., torch.Tensor] | None = None) -> int | None:
        """One whole training step at `batch` (forward, backward, both optimizers with their state and
        temporaries), then back to the initial weights and fresh optimizers. Returns the peak memory in bytes
        (CUDA; None elsewhere). Eager kernels, the model's and the optimizer updates' (compiling once per probed
        batch would cost minutes), unless `model` is the compiled one (`_compiled_probe`). Eager kernels keep
        more temporaries than compiled ones, so a batch that fits eager fits compiled."""
        if self.opts.test_oom_above is not None and batch > self.opts.test_oom_above:
            raise make_oom(f"out of memory: simulated by the test hook at batch {batch}")
        cuda = self.spec.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.spec.device)
        try:
            x, y = self.sampler.train_batch(0, batch)
            loss = (self.model if model is None else model)(x.to(self.device), y.to(self.device))
            loss.backward()
            del loss
            self.muon.step()
            self.adam.step()
            if cuda:
                synchronize(self.spec)
                return int(torch.cuda.max_memory_reserved(self.spec.device))
            return None
        finally:
            self._restore_initial()

    def _fit_batch(self, eager_only: bool = False) -> int:
        opts = self.opts
        pinned = None if self.reference is None else self.reference.fingerprint.get("batch_size")
        batch = opts.batch_size or pinned or opts.preset_spec.batch_size
        if pinned is not None and opts.batch_size is not None and opts.batch_size != pinned:
            raise ReferenceProblem(f"--batch-size {opts.batch_size} differs from the reference's {pinned}")
        fixed = pinned is not None or opts.batch_size is not None
        if fixed and self.spec.type == "cpu":
            return batch  # host memory: an allocation failure is not a clean exception to step down from
        # the batch grows only on a GPU, and only when nobody fixed it (a reference pins it, as before)
        grow = not fixed and self.spec.type == "cuda"
        base = 0
        if self.spec.type == "cuda":
            synchronize(self.spec)
            base = int(torch.cuda.memory_allocated(self.spec.device))

        def on_oom() -> None:
            self.model.zero_grad(set_to_none=True)
            empty_cache(self.spec)

        compiled_probe = None if eager_only or not self._fit_compiled() else self._compiled_probe
        fit = None
        try:
            fit = fit_batch(batch, self._oom_probe, is_oom, on_oom, seq_len=opts.preset_spec.seq_len,
                            target_tokens=opts.preset_spec.target_tokens if grow else 0,
                            total_memory_bytes=self.spec.total_memory_bytes, base_memory_bytes=base,
                            compiled_probe=compiled_probe, step_down=pinned is None)
        except BatchDoesNotFit as e:
            if pinned is not None:
                raise SetupProblem(f"out of memory at batch {e.batch}, which the reference was recorded with; "
                                   f"free memory on the device or record a new reference") from None
            raise SetupProblem("out of memory even at batch 1: free memory on the device or use a smaller "
                               "--preset") from None
        finally:
            if fit is None or not fit.compiled_fit:
                self._forget_compiled()  # a compiled try that lost: setup compiles afresh at the batch taken
        self.compiled_fit = fit.compiled_fit
        for line in fit.step_downs:
            self._setup_warning("oom", line)
        for line in fit.growth:
            self.log(f"batch fit: {line}")
        empty_cache(self.spec)
        return fit.batch

    def _fit_compiled(self) -> bool:
        """Whether the fit may try the compiled step where the eager probes run out of memory: on a GPU, where
        the training compiles (on the CPU a fixed batch is not probed and the batch never grows)."""
        return self.use_compile and self.spec.type == "cuda"

    def _compiled_probe(self, batch: int) -> int | None:
        """The probe with the kernels the training will run: the model and the optimizer updates compiled here,
        and kept when the fit takes this batch (the start-up check's steps then run the same compiled code)."""
        if self.train_model is self.model:
            self.train_model = compiled.compile_model(self.model)
        return self._oom_probe(batch, self.train_model)

    def _forget_compiled(self) -> None:
        """Back to eager kernels and an empty compile cache, so the training's compile at another batch is the
        one a fresh process makes (a replay pinned to that batch compiles it from nothing)."""
        if self.train_model is self.model:
            return
        torch._dynamo.reset()
        self.train_model = self.model
        eager_updates()

    def _setup_warning(self, kind: str, detail: str) -> None:
        self.setup_problems.append(detail)
        self.warning_count += 1
        self.em.emit(WarningEvent(step=self.step, kind=kind, detail=detail, setup=True))
        self.log(f"setup problem: {detail}")

    def _check_repeatability(self) -> None:
        """Identical computations must agree bit for bit: the GEMM check, the canary, an attention forward and
        backward at the preset's shape, and real training steps at the training shape from the initial state,
        each twice in this process. (Across processes, the bisect's baseline replays its recording.)"""
        self.state = "calibrate"
        gemm_ok = self.gemm.calibrate([o for _ in range(REPEATABILITY_RUNS) for o in self.gemm.compute()])
        canary_ok = attention_ok = steps_ok = None
        misses = [] if gemm_ok else ["gemm"]
        if self.opts.mode != "gemm":
            canary_ok = self.canary.calibrate([self.canary.measure() for _ in range(REPEATABILITY_RUNS)])
            attention_ok = self._attention_repeatable
            step_miss = self._step_check()
            steps_ok = step_miss is None
            misses += [name for name, ok in (("canary", canary_ok), ("attention", attention_ok)) if not ok]
            misses += [step_miss] if step_miss else []
        self.repeatable = not misses
        self.repeatability = {"gemm": gemm_ok, "canary": canary_ok, "attention": attention_ok,
                              "steps": steps_ok}
        if misses:
            self.first_difference = FirstDifference(step=0, figure="start-up check: " + ", ".join(misses))
            self.log(f"start-up repeatability check: not bit-identical ({', '.join(misses)})")
        self._last_canary_t = time.monotonic()

    def _attention_smoke(self) -> bool:
        """Causal SDPA forward and backward at the preset's shape in the compute dtype, twice, compared bit for bit;
        and the same for flash attention's window on each window a layer runs it with. A kernel that fails here (an
        unsupported shape or architecture) is a setup problem, never the voltage."""
        p = self.opts.preset_spec
        rows = p.canary_batch
        gen = torch.Generator().manual_seed(12345)
        shape = (rows, p.n_head, p.seq_len, p.head_dim)
        base = [torch.randn(shape, generator=gen).to(self.device, self.dtype) for _ in range(4)]
        self.kernels["sdpa_backend"] = sdpa_backend(base[0])
        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, is_causal=True)
        checks: list[tuple[str, Callable[..., torch.Tensor], list[torch.Tensor]]]  # fn(q, k, v)
        checks = [(f"SDPA, {self.kernels['sdpa_backend']}", sdpa, base)]
        by_seq = [t.transpose(1, 2).contiguous() for t in base]  # flash's (batch, seq, heads, head_dim)
        for w in sorted({w for w, k in zip(p.windows(), self.attention_kernels, strict=True)
                         if k == attention.FLASH_WINDOW}):
            checks.append((f"flash with window {w}", functools.partial(attention.flash_window, window=w), by_seq))
        same = True
        for label, fn, inputs in checks:
            outs = []
            try:
                for _ in range(REPEATABILITY_RUNS):
                    q, k, v = (t.detach().clone().requires_grad_(True) for t in inputs[:3])
                    y = fn(q, k, v)
                    # the gradients of y.backward(inputs[3]), exactly (the product's backward multiplies by 1):
                    # an explicit gradient tensor makes torch.autograd import sympy, ~2 s of every engine's start
                    (y * inputs[3]).sum().backward()
                    assert q.grad is not None and k.grad is not None and v.grad is not None  # the backward set them
                    outs.append([t.detach().float().cpu() for t in (y, q.grad, k.grad, v.grad)])
            except Exception as e:
                if is_oom(e):
                    raise
                raise SetupProblem(f"attention ({label}) failed at the {p.name} preset's shape {list(shape)} in "
                                   f"{DTYPE_NAMES[self.dtype]}: {first_line(e, 200)}") from None
            same = same and all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                                for a, b in zip(outs[0], outs[1], strict=False))
        return same

    def _step_check(self) -> str | None:
        """CHECK_STEPS real training steps from the initial state, twice, digests compared: the first step that
        differed and in what, or None when both runs agree."""
        pending, self.oom_at_step_pending = self.oom_at_step_pending, None
        runs: list[list[str]] = []
        try:
            for _ in range(REPEATABILITY_RUNS):
                self._restore_initial()
                digests = []
                for s in range(1, CHECK_STEPS + 1):
                    self.injector.flaw.perturb(self.model)
                    r = self.train_step(s)
                    digests.append(step_digest(r.loss, r.grad_norm, r.param_sum))
                runs.append(digests)
        finally:
            self._restore_initial()
            self.oom_at_step_pending = pending
        return next((f"training step {i + 1} ({first_differing(a, b)})"
                     for i, (a, b) in enumerate(zip(runs[0], runs[1], strict=False)) if a != b), None)

    def _enforce_repeatability(self) -> None:
        """No silent downgrade: a start-up check that is not bit-identical is never answered with tolerances
        unless the run asked for them (--tolerance)."""
        if self.repeatable or self.opts.tolerance:
            return
        what = self.first_difference.figure if self.first_difference else "start-up check"
        if self.opts.verify_repeatable:
            self._fail(Finding("not-repeatable", f"this platform does not repeat bit for bit: the {what} differed "
                                                 f"between two runs in one process; {NOT_REPEATABLE_HELP}"), 0)
        if self.reference is not None:
            # comparing with a stock recording: at an undervolt this is a miscomputation like any canary miss
            self._fail(Finding("canary", f"the start-up repeatability check was not bit-identical ({what})"), 0)
        raise _End("error", f"this platform does not repeat bit for bit ({what} differed between two identical "
                   f"runs); {NOT_REPEATABLE_HELP}", "not-repeatable", 0, EXIT_ERROR)

    def fingerprint(self) -> dict:
        p = self.opts.preset_spec
        fp = {
            "protocol": PROTOCOL_VERSION, "preset": self.opts.preset, "depth": p.depth, "width": p.width,
            "head_dim": p.head_dim, "seq_len": p.seq_len, "batch_size": self.batch_size, "seed": self.opts.seed,
            "dtype": DTYPE_NAMES[self.dtype], "device_type": self.spec.type, "device_name": self.spec.name,
            "data_sha256": self.corpus.sha256, **versions(),
            # what decides which kernels run, and so the bits: the choices, the environment, the driver
            "kernels": dict(self.kernels.items()), "kernel_env": kernel_env(),
            "driver_version": driver_version(self.spec),
        }
        if p.bpe:  # only where they differ from the byte-level presets, so older references still load
            fp.update(vocab=p.vocab, window_pattern=p.window_pattern, value_embeds=p.value_embeds,
                      tokenizer_sha256=self.corpus.tokenizer_sha256)
        if self.use_compile:
            fp["compile"] = True
        if attention.FLASH_WINDOW in self.attention_kernels:  # only then: references of the other kernels load
            fp["attention_kernels"] = list(self.attention_kernels)
        if self.spec.type == "cpu":
            fp["threads"] = torch.get_num_threads()
        if self.dp is not None:  # a rank's trajectory depends on the group: its data shard and the averaged grads
            fp.update(world_size=self.opts.world_size, rank=self.opts.rank, collective=self.dp.library)
        return fp

    def _attach_reference(self) -> None:
        ref = self.reference
        if ref is None:
            return
        diff = fingerprint_diff(ref.fingerprint, self.fingerprint())
        if diff:
            raise ReferenceProblem(f"--reference {self.opts.reference!r} {MISMATCH}"
                                   + "; ".join(diff))
        tol = self.opts.reference_tolerance if self.opts.tolerance else None
        self.trajectory = ReferenceTrajectory(ref.digests, tol)
        if self.opts.verify_repeatable and tol is not None:
            self.bitwise_probe = ReferenceTrajectory(ref.digests)

    def _check_reference_canary(self) -> None:
        """The golden canary must equal the reference's (same weights, batch and kernels, recorded at stock)."""
        ref = self.reference
        if ref is None or ref.canary is None or not self.repeatable:
            return
        assert self.canary.golden is not None  # a repeatable start-up check calibrated the canary
        mine = self.canary.golden.digest()
        if mine != ref.canary:
            self._fail(Finding("canary", f"the canary's first result {mine} differs from the reference's "
                                         f"{ref.canary} (same weights, batch and kernels)"), 0)

    def _emit_start(self) -> None:
        o, p = self.opts, self.opts.preset_spec
        training = o.mode != "gemm"
        tokens = self.batch_size * p.seq_len if training else 0
        ref = None if self.reference is None else ReferenceInUse(path=str(o.reference), steps=self.reference.steps)
        data = None
        if training:
            tokenizer = TokenizerInfo(kind="bpe", vocab_size=self.tokenizer.vocab_size, sha256=self.tokenizer.sha256,
                                      cached=not self.tokenizer.trained, path=str(self.tokenizer.path)) \
                if self.tokenizer is not None else UNSET
            data = DataSource(source=self.corpus.source, bytes=self.corpus.nbytes, files=self.corpus.files,
                              sha256=self.corpus.sha256, tokens=self.corpus.tokens, tokenizer=tokenizer)
        self.em.emit(StartEvent(
            protocol=PROTOCOL_VERSION,
            mode=o.mode,
            preset=o.preset,
            device=o.device,
            device_type=self.spec.type,
            device_name=self.spec.name,
            pci_bus_id=self.spec.pci_bus_id,
            dtype=DTYPE_NAMES[self.dtype],
            params=self.n_params if training else 0,
            tokens_per_step=tokens,
            flops_per_step=self.flops_per_token * tokens if training else self.gemm.flops,
            batch_size=self.batch_size,
            seq_len=p.seq_len,
            model=ModelShape(depth=p.depth, width=p.width, n_head=p.n_head, head_dim=p.head_dim, vocab=p.vocab,
                             window_pattern=p.window_pattern, windows=tuple(p.windows()),
                             value_embeds=p.value_embeds,
                             embed_dtype=DTYPE_NAMES[self.model.wte.weight.dtype])
            if training else None,
            compile=self.use_compile,  # never on in gemm mode
            attention_kernels=tuple(self.attention_kernels) if training else None,
            seed=o.seed,
            steps=o.steps,
            duration_s=o.duration_s,
            warmup_steps=o.effective_warmup_steps,
            canary_every=o.canary_every,
            canary_every_s=o.canary_every_s,
            gemm_n=self.gemm.n,
            gemm_repeats=self.gemm.repeats,
            data=data,
            repeatable=bool(self.repeatable),
            repeatability=self.repeatability,
            first_difference=self.first_difference,
            sensitivity=self.sensitivity,
            tolerance=self.opts.tolerance,
            verify_repeatable=self.opts.verify_repeatable,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_mode=deterministic_mode(),
            kernels=self.kernels,
            kernel_env=kernel_env(),
            driver_version=driver_version(self.spec),
            threads=torch.get_num_threads(),
            reference=ref,
            record=o.record,
            fault_rate=o.fault_rate,
            fault_seed=o.effective_fault_seed,
            injections=tuple(str(i) for i in o.injections),
            visible_devices=visibility_env(),
            setup_problems=tuple(self.setup_problems),
            data_parallel=self._dp_status(),
            **versions(),
        ))
        self.log(f"{o.mode} on {self.spec.name} ({DTYPE_NAMES[self.dtype]}), preset {o.preset}"
                 + (f", {self.n_params:,} parameters, {tokens:,} tokens/step" if training else "")
                 + (f", attention {'/'.join(self.attention_kernels)}" if training else "")
                 + (", REDUCED SENSITIVITY (--tolerance)" if self.opts.tolerance else ""))

    def _dp_status(self) -> DataParallelStatus | None:
        if self.dp is None:
            return None
        return DataParallelStatus(world_size=self.opts.world_size, rank=self.opts.rank, backend=self.dp.backend,
                                  library=self.dp.library, collectives=self.dp.collectives,
                                  collective_s=round(self.dp.collective_s, 4))

    @property
    def sensitivity(self) -> str:
        return "reduced" if self.opts.tolerance else "full"

    # --- one training step ----------------------------------------------------------------------------------

    def train_step(self, step: int, data_step: int | None = None) -> StepResult:
        """The training computation only: forward, backward, gradient norm, optimizer. No checks.
        `data_step` picks the batch (the step within the reference segment when looping; default `step`)."""
        t0 = time.perf_counter()
        if self.oom_at_step_pending is not None and step == self.oom_at_step_pending:
            self.oom_at_step_pending = None
            raise make_oom(f"out of memory: simulated by the test hook at step {step}")
        x, y = self.sampler.train_batch(step if data_step is None else data_step, self.batch_size)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        loss = self.train_model(x, y)
        loss.backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        # this rank's own gradients (before the all-reduce): loss and grad_norm are figures only this rank's
        # computation decides; the training state after the update is the group's (tuner/tuning/trial.py
        # pins a fault on the rank whose own figures differ)
        grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)).float())
        grad_sum = None
        if self.dp is not None and self._dp_sync:
            grad_sum = bit_checksum(grads)  # exact (a norm can round a one-bit change away)
            self.dp.all_reduce_grads(self.params)
        self.muon.step()
        self.adam.step()
        self.model.zero_grad(set_to_none=True)
        # every bit the next step depends on: parameters and optimizer state (a flip that only reaches the
        # momentum this step is caught now, not a step later: bench/engine_detection.py, Part D)
        param_sum = bit_checksum([*self.flat_params, *self._optimizer_state()])
        as_int = [loss.detach().float().view(torch.int32).to(torch.int64),
                  grad_norm.float().view(torch.int32).to(torch.int64), param_sum]
        if grad_sum is not None:
            as_int.append(grad_sum.to(param_sum.device))
        bits = torch.stack(as_int).tolist()  # one host sync, exact bits
        return StepResult(f32_from_bits(bits[0] & 0xFFFFFFFF), f32_from_bits(bits[1] & 0xFFFFFFFF),
                          time.perf_counter() - t0, x.numel(), bits[2], bits[3] if grad_sum is not None else None)

    def _optimizer_state(self) -> list[torch.Tensor]:
        return [*(b for bufs in self.muon.buffers.values() for b in bufs),  # momentum, second moment
                *(t for pairs in self.adam.state.values() for m, v in pairs for t in (m, v))]

    def reference_step(self, step: int | None) -> int | None:
        """The reference step `step` is compared with: itself, or with --reference-loop its step within the pass
        (the same batch from the same weights). None without a reference."""
        if self.trajectory is None or step is None:
            return None
        n = self.trajectory.reference_steps
        if self.opts.reference_loop and n and step > 0:
            return (step - 1) % n + 1
        return step

    def _emit_fault(self, finding: Finding, step: int | None) -> _End:
        """The fault event; returns the run's end it makes."""
        self.em.emit(FaultEvent(kind=finding.kind, step=step, reference_step=self.reference_step(step),
                                detail=finding.detail, figure=finding.figure))
        return _End("fail", finding.detail, finding.kind, step, EXIT_FAULT)

    def _fail(self, finding: Finding, step: int) -> None:
        self.fault_figure = finding.figure
        end = self._emit_fault(finding, step)
        self.log(f"FAULT {finding.kind} at step {step}: {finding.detail}")
        raise end

    def step_once(self) -> None:
        """One training step with everything around it: injection, checks, events, canaries, phases."""
        step = self.step + 1
        if self.injector.hang_at(step):
            self._hang(step)
        self.state = "train"
        seg_step = self._segment_step(step)
        self.injector.before_train_step(step, self.model)
        try:
            r = self.train_step(step, seg_step)
        except Exception as e:
            if is_oom(e):
                self._oom_mid_run(step)
                return
            raise
        finally:
            self.injector.disarm()
        self.step = step
        self.progress += 1
        self._steps_since_idle += 1
        steady = step > self.opts.effective_warmup_steps and self._steps_since_idle > 2
        tok_s = r.tokens / r.dt_s if r.dt_s > 0 else None
        self.em.emit(StepEvent(step=step, loss=r.loss, grad_norm=r.grad_norm, dt_ms=round(r.dt_s * 1e3, 3),
                               tok_s=None if tok_s is None else round(tok_s, 1),
                               tflops=round(self.flops_per_token * r.tokens / r.dt_s / 1e12, 6) if r.dt_s > 0 else None,
                               phase=self._phase if self.opts.mode == "mixed" else UNSET))
        if steady:
            self.step_times.append(r.dt_s)
            if tok_s is not None:
                self.tok_s.append(tok_s)
        finding = self.nonfinite.check(r.loss, r.grad_norm)
        if finding is None and self.trajectory is not None:
            finding = self.trajectory.check(seg_step, r.loss, r.grad_norm, r.param_sum, r.grad_sum)
            if self.opts.verify_repeatable:
                finding = self._replay_check(step, r, finding)
        if finding is not None:
            self._fail(finding, step)
        if self.recorder is not None:
            self.recorder.append(step, r.loss, r.grad_norm, r.param_sum, r.grad_sum)
        for w in self.soft.observe(step, r.loss, r.grad_norm, tok_s, steady):
            self.warning_count += 1
            self.em.emit(WarningEvent(step=step, kind=w.kind, detail=w.detail, setup=False))
            self.log(f"warning at step {step}: {w.kind}: {w.detail}")
            self._canary_pending = self._canary_pending or "soft-signal"
        reason = self._canary_pending
        if reason is None and self.opts.canary_every and step % self.opts.canary_every == 0:
            reason = "scheduled"
        if reason is None and self.opts.canary_every_s and time.monotonic() - self._last_canary_t >= \
                self.opts.canary_every_s:
            reason = "time"
        if reason is not None:
            self.run_canary(reason)

    def _segment_step(self, step: int) -> int:
        """With --reference-loop: the step within the current pass over the reference; at the start of each
        new pass the model and optimizers go back to their initial state, so the recorded trajectory repeats."""
        seg = self.reference_step(step) or step
        if seg == 1 and step > 1:  # a new pass over the reference (--reference-loop)
            assert self.trajectory is not None  # the loop is over its steps
            n = self.trajectory.reference_steps
            self._restore_initial()
            self.soft = SoftSignals()  # the loss restarts high: not a spike
            self.segment = (step - 1) // n + 1
            self.em.emit(SegmentEvent(step=step - 1, segment=self.segment, reference_steps=n))
            self.log(f"reference segment {self.segment}: restarting from the initial weights at step {step}")
        return seg

    def _replay_check(self, step: int, r: StepResult, finding: Finding | None) -> Finding | None:
        """--verify-repeatable: note the first step that is not bit-identical; a comparison that fails (bitwise, or
        the tolerance with --tolerance) means the platform does not repeat at stock."""
        bitwise = finding if self.bitwise_probe is None else \
            self.bitwise_probe.check(step, r.loss, r.grad_norm, r.param_sum, r.grad_sum)
        if bitwise is not None and self.first_difference is None:
            self.first_difference = FirstDifference(step=step, figure=str(bitwise.figure))
        if finding is None:
            return None
        return Finding("not-repeatable", f"a replay at stock in a second process is not bit-identical: "
                                         f"{finding.detail}; {NOT_REPEATABLE_HELP}", finding.figure)

    def _write_repeatability(self) -> None:
        """--verify-repeatable: record the outcome in the reference file."""
        assert self.opts.reference is not None  # --verify-repeatable requires --reference (options.py)
        try:
            first = None if self.first_difference is None else msgspec.structs.asdict(self.first_difference)
            mark_repeatability(self.opts.reference, first is None, first, self.step)
        except (OSError, ReferenceProblem) as e:
            self.log(f"could not record the replay's outcome in {self.opts.reference}: {e}")

    def run_canary(self, reason: str) -> None:
        self.state = "canary"
        self._canary_pending = None
        index = self.canary_count + 1
        t0 = time.perf_counter()
        with self.injector.during_canary(self.canary.model, index):
            sample = self.canary.measure()
        finding = self.canary.check(sample)
        gemm_finding = self._gemm_round(index)
        self.canary_count = index
        self.progress += 1
        self._last_canary_t = time.monotonic()
        self.em.emit(CanaryEvent(step=self.step, index=index, reason=reason, ok=finding is None,
                                 gemm_ok=gemm_finding is None, digest=sample.digest(),
                                 dt_ms=round((time.perf_counter() - t0) * 1e3, 3)))
        if finding is not None:
            self._fail(finding, self.step)
        if gemm_finding is not None:
            self._fail(gemm_finding, self.step)
        self.state = "train"

    def _oom_mid_run(self, step: int) -> None:
        self.model.zero_grad(set_to_none=True)
        empty_cache(self.spec)
        if self.trajectory is not None or self.recorder is not None:
            raise _End("error", f"out of memory at step {step} with batch {self.batch_size}; a reference "
                       "trajectory needs a fixed batch (setup problem, not instability)", "oom", step, EXIT_ERROR)
        if self.batch_size == 1:
            raise _End("error", f"out of memory at step {step} even at batch 1 (setup problem, not instability)",
                       "oom", step, EXIT_ERROR)
        new = self.batch_size // 2
        self._setup_warning("oom", f"out of memory at step {step} with batch {self.batch_size}; stepped down "
                                   f"to {new}")
        self.batch_size = new

    def _hang(self, step: int) -> None:
        """The hang injection: go silent (no heartbeats either) and never return, ignoring SIGTERM."""
        self.log(f"inject: hang at step {step} (no more output; SIGKILL ends this)")
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.state = "hung"
        while True:
            self.sleep(1.0)
            if not parent_alive(self.opts.parent_pid):  # nobody left to kill us: do not sleep forever
                self.log("the process that started the engine has exited: ending the hang")
                os._exit(EXIT_INTERRUPTED)

    # --- GEMM mode ------------------------------------------------------------------------------------------

    def gemm_once(self) -> None:
        self.state = "gemm"
        index = self.step + 1
        if self.injector.hang_at(index):
            self._hang(index)
        t0 = time.perf_counter()
        finding = self._gemm_round(index)
        dt = time.perf_counter() - t0
        self.step = index
        self.progress += 1
        if index > self.opts.effective_warmup_steps:
            self.step_times.append(dt)
        self.em.emit(GemmEvent(step=index, ok=finding is None, dt_ms=round(dt * 1e3, 3),
                               tflops=round(self.gemm.flops / dt / 1e12, 6) if dt > 0 else None, n=self.gemm.n,
                               repeats=self.gemm.repeats))
        if finding is not None:
            self._fail(finding, index)

    def _gemm_round(self, index: int) -> Finding | None:
        """The GEMM check's repeats (an injection aimed at round `index` tampers with them), each compared with
        the first result; the outputs are freed on return."""
        outputs = self.gemm.compute()
        self.injector.tamper_gemm(outputs, index)
        return self.gemm.compare(outputs)

    # --- the loop -------------------------------------------------------------------------------------------

    def _bounded(self) -> bool:
        o = self.opts
        if o.steps is not None and self.step >= o.steps:
            return True
        return o.duration_s is not None and time.monotonic() - self._loop_start >= o.duration_s

    def _check_stop(self) -> None:
        if self.stop_signal is not None:
            raise _End("error", f"interrupted by {self.stop_signal}", "interrupted", None, EXIT_INTERRUPTED)
        if self.em.broken:
            raise _End("error", "stdout closed by the reader", "interrupted", None, EXIT_INTERRUPTED)

    def _set_phase(self, phase: str, left_s: float) -> None:
        if phase != self._phase:
            self._phase = phase
            self.em.emit(PhaseEvent(step=self.step, phase=phase, duration_s=round(left_s, 3)))
            self.log(f"phase: {phase} for {left_s:.1f} s")

    def _idle(self, seconds: float) -> None:
        self.state = "idle"
        end = time.monotonic() + seconds
        # data-parallel ranks idle the whole gap (the next agreement decides whether to stop, for all at once)
        while (left := end - time.monotonic()) > 0 and (self.dp is not None or not self._bounded()):
            self._check_stop()
            self.sleep(min(left, 0.05))
        self._steps_since_idle = 0

    def _agree(self) -> tuple[bool, tuple[str, float] | None]:
        """(stop now, the mixed-mode phase and seconds left in it). With data-parallel ranks, one small collective:
        every rank stops when any reached its bound (so all make the same number of steps), and every rank
        follows rank 0's phase (so they idle together instead of waiting for each other)."""
        bounded = self._bounded()
        mixed = self.opts.mode == "mixed"
        phase = mixed_phase(self.opts, time.monotonic() - self._loop_start) if mixed else None
        if self.dp is None:
            return bounded, phase
        mine = [int(bounded), 0, 0]
        if phase is not None and self.opts.rank == 0:
            mine[1:] = [PHASE_CODES[phase[0]], int(phase[1] * 1000)]
        stop, code, left_ms = self.dp.agree(mine)
        return bool(stop), (PHASE_NAMES[code], left_ms / 1000) if phase is not None and code else phase

    def loop(self) -> None:
        self._loop_start = time.monotonic()
        self._dp_sync = True
        while True:
            self._check_stop()
            stop, phase_left = self._agree()
            if stop:
                break
            if self.opts.mode == "gemm":
                self.gemm_once()
                continue
            if phase_left is not None:
                phase, left = phase_left
                self._set_phase(phase, left)
                if phase == "idle":
                    self._idle(left)
                    continue
            t0 = time.monotonic()
            self.step_once()
            if self._phase == "partial":  # mixed mode only
                busy = time.monotonic() - t0
                phase, left = mixed_phase(self.opts, time.monotonic() - self._loop_start)
                if phase == "partial":
                    self.state = "partial-idle"
                    self.sleep(min(busy * (1 / self.opts.partial_duty - 1), left))
        self.state = "done"

    # --- the end --------------------------------------------------------------------------------------------

    def evaluate(self) -> tuple[float | None, list[float]]:
        """Held-out bits per byte and the per-window losses (nats per token), on fixed windows. BPE presets: the
        total nats over the total UTF-8 bytes of the target tokens."""
        if self.opts.mode == "gemm":
            return None, []
        self.state = "eval"
        x, y = self.sampler.heldout_batch(self.opts.preset_spec.eval_windows)
        losses: list[float] = []
        nats, nbytes = 0.0, 0
        chunk = max(1, self.batch_size)
        with torch.no_grad():
            for i in range(0, x.size(0), chunk):
                per_token = self.model(x[i:i + chunk].to(self.device), y[i:i + chunk].to(self.device), "none")
                per_token = per_token.float().cpu()
                losses.extend(per_token.mean(dim=1).tolist())
                if self.token_bytes is not None:
                    weights = self.token_bytes[y[i:i + chunk]]
                    nats += float((per_token * (weights > 0)).sum())
                    nbytes += int(weights.sum())
        finite = [v for v in losses if math.isfinite(v)]
        bpb = None
        if len(finite) == len(losses) and losses:
            if self.token_bytes is None:
                bpb = statistics.fmean(finite) / math.log(2)
            elif nbytes > 0 and math.isfinite(nats):
                bpb = nats / math.log(2) / nbytes
        return bpb, losses

    def _finish(self) -> tuple[float | None, list[float], str | None]:
        """After a pass: held-out evaluation, and the reference file when recording (heartbeats still on)."""
        bpb, eval_losses = self.evaluate()
        recorded = None
        if self.recorder is not None:
            canary = self.canary.golden.digest() if self.repeatable and self.canary.golden else None
            assert self.opts.record is not None  # the recorder exists only with --record
            save_reference(self.opts.record, Reference(self.fingerprint(), self.recorder.digests, canary))
            recorded = self.opts.record
        return bpb, eval_losses, recorded

    def _emit_end(self, end: _End, duration_s: float, bpb: float | None, eval_losses: list[float],
                  recorded: str | None) -> None:
        trajectory = self.trajectory
        reference = None if trajectory is None else ReferenceCompared(
            path=str(self.opts.reference),
            reference_steps=trajectory.reference_steps,
            compared_steps=trajectory.compared,
            beyond_reference_steps=trajectory.beyond,
            note=(f"steps after {trajectory.reference_steps} were not compared (past the reference's end)"
                  if trajectory.beyond else None),
            tolerance=trajectory.tolerance,
            loop=self.opts.reference_loop,
            segments=self.segment,
        )
        failed = end.verdict == "fail"
        self.em.emit(EndEvent(
            verdict=end.verdict,
            reason=end.reason,
            kind=end.kind,
            step=end.step,
            reference_step=self.reference_step(end.step) if failed else None,
            steps=self.step,
            duration_s=round(duration_s, 3),
            median_step_ms=round(statistics.median(self.step_times) * 1e3, 3) if self.step_times else None,
            median_tok_s=round(statistics.median(self.tok_s), 1) if self.tok_s else None,
            bpb=None if bpb is None else round(bpb, 6),
            eval_losses=tuple(round(v, 6) if math.isfinite(v) else v for v in eval_losses),
            reference=reference,
            recorded=recorded,
            sensitivity=None if self.repeatable is None else self.sensitivity,
            first_difference=self.first_difference,
            setup_problems=tuple(self.setup_problems),
            warnings=self.warning_count,
            canaries=self.canary_count,
            exit_code=end.exit_code,
            figure=self.fault_figure if failed else None,
            data_parallel=self._dp_status(),
        ))

    def run(self) -> int:
        """Set up, loop, end. Always emits exactly one `end` event."""
        watch = self.watch_parent if self.opts.parent_pid is not None else None
        self.heartbeat = Heartbeat(self.em, self.heartbeat_status, self.opts.heartbeat_s, tick=watch).start()
        try:
            self.watch_parent()  # it may be gone already
            self._check_stop()
            self.setup()
            self.loop()
            by_time = self.opts.duration_s is not None and (self.opts.steps is None or self.step < self.opts.steps)
            end = _End("pass", f"completed {self.opts.duration_s:g} s" if by_time else f"completed {self.step} steps",
                       exit_code=EXIT_PASS)
        except _End as e:
            end = e
        except PeerLost as e:  # another rank died or stalled: not a fault of this rank (the host: inconclusive)
            end = _End("error", f"peer stalled: {e} (this rank's checks passed up to step {self.step})", "peer")
            self.log(end.reason)
        except (UsageProblem, DataProblem, ReferenceProblem) as e:
            end = _End("error", str(e), "usage")
            self.log(f"error: {e}")
        except SetupProblem as e:
            end = _End("error", str(e), "setup")
            self.log(f"setup error: {e}")
        except Exception as e:  # noqa: BLE001 - classified below
            finding = device_error(e)
            if finding is not None and self.step == 0:
                # before the first completed step: the kernels or the environment, not the voltage
                end = _End("error", f"device error before the first completed step (a setup problem, not "
                                    f"instability): {finding.detail}", "setup")
                self.log(end.reason)
            elif NOT_DETERMINISTIC in str(e):
                end = _End("error", f"an operation has no deterministic implementation on this platform: "
                                    f"{first_line(e)}",
                           "setup")
                self.log(end.reason)
            elif finding is not None:  # a device error counts against the setting
                failed_step = (self.step + 1 if self.state == "train" else self.step) if self._setup_done else None
                end = self._emit_fault(finding, failed_step)
                self.log(f"FAULT device-error: {finding.detail}")
            elif is_oom(e):
                end = _End("error", f"out of memory: {e} (setup problem, not instability)", "oom")
                self.log(end.reason)
            else:
                end = _End("error", f"internal error: {type(e).__name__}: {e}", "internal")
                traceback.print_exc(file=sys.stderr)
        duration = time.monotonic() - self._loop_start if self._loop_start else 0.0
        finished: tuple = (None, [], None)
        if end.verdict == "pass" and self._setup_done:
            try:
                finished = self._finish()
            except Exception as e:  # noqa: BLE001 - the run passed; the report must still go out
                finding = device_error(e)
                if finding is not None:
                    end = self._emit_fault(finding, self.step)
                else:
                    traceback.print_exc(file=sys.stderr)
                    end = _End("error", f"error while finishing: {e}", "internal")
        if self.opts.verify_repeatable and self._setup_done:
            self._write_repeatability()
        if self.dp is not None:
            self.dp.close()
        if self.heartbeat is not None:
            self.heartbeat.stop()  # before `end`, which must be the last line
        try:
            self._emit_end(end, duration, *finished)
        except Exception as e:  # noqa: BLE001 - the end event must still go out
            traceback.print_exc(file=sys.stderr)
            self.em.emit(EndEvent.before_work(f"internal error while ending: {e}", "internal", EXIT_ERROR,
                                              step=end.step, steps=self.step, duration_s=round(duration, 3)))
            return EXIT_ERROR
        return end.exit_code

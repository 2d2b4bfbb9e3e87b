"""Each detector on its own, fed measurements directly (no engine, no fault injector)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.engine.detectors import (
    CanaryReplay,
    GemmCheck,
    NonFiniteDetector,
    ReferenceTrajectory,
    SoftSignals,
    TrajectoryRecorder,
    device_error,
)
from tuner.engine.model import GPT, GPTConfig
from tuner.engine.patterns import match_device_error
from tuner.engine.reference import step_digest


def test_nonfinite_fires_on_the_first_nan_or_inf_only():
    d = NonFiniteDetector()
    assert d.check(2.5, 0.3) is None
    assert d.check(math.nan, 0.3).kind == "nonfinite"
    assert "grad_norm" in d.check(1.0, math.inf).detail


def test_reference_trajectory_bitwise_and_past_its_end():
    rec = TrajectoryRecorder()
    values = [(5.5, 1.25), (4.0, 0.75), (3.5, 0.5)]
    for i, (loss, gn) in enumerate(values, 1):
        rec.append(i, loss, gn)
    ref = ReferenceTrajectory(rec.digests)
    assert ref.check(1, 5.5, 1.25) is None
    nudged = 4.0 + 2**-21  # one float32 ulp above 4.0
    finding = ref.check(2, nudged, 0.75)
    assert finding is not None and finding.kind == "mismatch" and "step 2" in finding.detail
    assert ref.check(3, 3.5, 0.5) is None
    assert ref.check(4, 99.0, 9.0) is None and ref.check(5, 1.0, 1.0) is None
    assert (ref.compared, ref.beyond, ref.reference_steps) == (3, 2, 3)


def test_reference_with_parameter_checksums_catches_a_silent_weight_change():
    rec = TrajectoryRecorder()
    rec.append(1, 5.5, 1.25, 123456789)
    ref = ReferenceTrajectory(rec.digests)
    assert ref.check(1, 5.5, 1.25, 123456789) is None
    finding = ref.check(1, 5.5, 1.25, 123456789 + 2**22)
    assert finding.kind == "mismatch" and "bit checksum" in finding.detail
    assert ReferenceTrajectory([step_digest(5.5, 1.25)]).check(1, 5.5, 1.25, 42) is None  # old 16-digit digests


@given(bit=st.integers(0, 31), index=st.integers(0, 99))
def test_bit_checksum_sees_every_single_bit_flip(bit, index):
    from tuner.engine.detectors import bit_checksum
    from tuner.engine.faults import flip_bit_

    t = torch.randn(100, generator=torch.Generator().manual_seed(0))
    before = int(bit_checksum([t, torch.ones(3)]))
    flip_bit_(t, index, bit)
    assert abs(int(bit_checksum([t, torch.ones(3)])) - before) == 2**bit


def test_reference_tolerance_mode_only_catches_gross_divergence():
    ref = ReferenceTrajectory([step_digest(4.0, 1.0)] * 3, tolerance=0.05)
    assert ref.check(1, 4.1, 1.2) is None
    assert ref.check(2, 4.5, 1.0).kind == "mismatch"
    assert ref.check(3, math.nan, 1.0).kind == "mismatch"


def test_recorder_insists_on_consecutive_steps():
    rec = TrajectoryRecorder()
    rec.append(1, 1.0, 1.0)
    with pytest.raises(ValueError):
        rec.append(3, 1.0, 1.0)


@pytest.fixture(scope="module")
def canary():
    cfg = GPTConfig(depth=1, width=32, head_dim=16, seq_len=16)
    model = GPT(cfg)
    model.init_weights(torch.Generator().manual_seed(0))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    return CanaryReplay(model, x, x)


def test_canary_is_repeatable_and_catches_a_changed_weight(canary):
    assert canary.calibrate([canary.measure(), canary.measure()]) is True
    assert canary.check(canary.measure()) is None
    w = canary.model.blocks[0].mlp.c_fc.weight
    with torch.no_grad():
        w[3, 4] += 1e-3
    try:
        finding = canary.check(canary.measure())
    finally:
        with torch.no_grad():
            w[3, 4] -= 1e-3
    assert finding is not None and finding.kind == "canary"


def test_canary_checksums_catch_a_flip_that_no_statistic_shows(canary):
    canary.calibrate([canary.measure()])
    emb = canary.model.wte.weight
    from tuner.engine.faults import flip_bit_

    flip_bit_(emb.data, 255 * emb.shape[1], 0)  # byte 255's row: unused by the canary batch
    try:
        finding = canary.check(canary.measure())
    finally:
        flip_bit_(emb.data, 255 * emb.shape[1], 0)
    assert finding is not None and "frozen weights" in finding.detail


def test_canary_tolerance_mode_when_not_repeatable(canary):
    a = canary.measure()
    b = type(a)(a.loss * (1 + 1e-6), a.stats, a.bits)
    assert canary.calibrate([a, b]) is False and canary.tolerance == pytest.approx(4e-6, rel=0.01)
    assert canary.check(type(a)(a.loss * (1 + 2e-6), a.stats)) is None
    assert canary.check(type(a)(a.loss * 1.01, a.stats)).kind == "canary"
    canary.calibrate([canary.measure()])  # back to bitwise for other tests


def test_gemm_check_catches_one_wrong_element():
    g = GemmCheck(32, torch.float32, torch.device("cpu"), repeats=3)
    assert g.calibrate(g.compute() + g.compute()) is True
    assert g.compare(g.compute()) is None
    outs = g.compute()
    outs[2].view(-1)[17] = outs[2].view(-1)[17] * 1.0000001 + 1e-6
    finding = g.compare(outs)
    assert finding is not None and finding.kind == "gemm" and "repeat 3/3: 1 element" in finding.detail


def test_gemm_check_in_bf16_compares_bits():
    g = GemmCheck(16, torch.bfloat16, torch.device("cpu"), repeats=2)
    assert g.calibrate(g.compute()) is True
    outs = g.compute()
    outs[0].view(torch.int16).view(-1)[0] ^= 1
    assert g.compare(outs).kind == "gemm"


def test_soft_signals_warn_on_spikes_and_throughput_drops():
    s = SoftSignals(min_history=20, tput_min_history=30, tput_window=10, cooldown_steps=5)
    warnings = []
    for step in range(1, 61):
        loss = 3.0 - step * 0.01 + (0.02 if step % 2 else 0.0)
        gn = 0.5 + (0.05 if step % 3 else 0.0)
        tok = 10_000.0 if step < 50 else 5_000.0
        if step == 40:
            loss = 9.0
        if step == 45:
            gn = 20.0
        warnings += [(step, w.kind) for w in s.observe(step, loss, gn, tok, steady=True)]
    assert (40, "loss-spike") in warnings and (45, "grad-spike") in warnings
    assert any(kind == "throughput-drop" and step >= 55 for step, kind in warnings)
    assert len([w for w in warnings if w[1] != "throughput-drop"]) == 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=30, max_size=120))
def test_soft_signals_never_warn_on_a_falling_loss(losses):
    s = SoftSignals()
    falling = sorted(losses, reverse=True)
    for step, loss in enumerate(falling, 1):
        assert [w for w in s.observe(step, loss, 1.0, None, steady=False) if w.kind == "loss-spike"] == []


@pytest.mark.parametrize(("text", "label"), [
    ("CUDA error: an illegal memory access was encountered", "illegal memory access"),
    ("Memory access fault by GPU node-1 (Agent handle: 0x55) on address 0x7f00. Reason: Page not present",
     "memory access fault"),
    ("HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. code: 0x1016",
     "HSA error"),
    ("RuntimeError: CUDA error: unspecified launch failure", "unspecified launch failure"),
    ("hipErrorLaunchFailure", "HIP error"),
    ("vkQueueSubmit failed: device lost", "device lost"),
    ("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm", "BLAS failure"),
])
def test_device_error_patterns(text, label):
    assert match_device_error(text) == label
    assert device_error(RuntimeError(text)).kind == "device-error"


def test_out_of_memory_is_not_a_device_error():
    assert match_device_error("CUDA out of memory. Tried to allocate 20.00 MiB") is None
    assert device_error(RuntimeError("HIP out of memory")) is None
    assert device_error(ValueError("shape mismatch")) is None


def test_mismatch_message_names_only_the_figures_that_differ():
    from tuner.engine.detectors import ReferenceTrajectory
    from tuner.engine.reference import step_digest

    trajectory = ReferenceTrajectory([step_digest(2.5, 1.25, 7)], None)
    finding = trajectory.check(1, 2.5, 1.2500001, 8)  # steps count from 1
    assert finding is not None and finding.kind == "mismatch"
    assert "grad_norm" in finding.detail and "checksum" in finding.detail and "loss" not in finding.detail

"""The batch fit on its own: halve to fit, then grow (powers of two) to the target or the memory headroom."""

from __future__ import annotations

import pytest

from tuner.engine.batchfit import BatchDoesNotFit, fit_batch


class _Oom(Exception):
    pass


def fake_device(limit_batch: int, per_row_bytes: int = 1 << 30, base: int = 4 << 30):
    """A probe like the GPU's: out of memory above `limit_batch`, else the peak memory of a step."""
    probed: list[int] = []

    def probe(batch: int) -> int:
        probed.append(batch)
        if batch > limit_batch:
            raise _Oom(f"out of memory at {batch}")
        return base + batch * per_row_bytes

    return probe, probed


def fit(start, probe, **kw):
    return fit_batch(start, probe, lambda e: isinstance(e, _Oom), lambda: None, seq_len=2048, **kw)


def test_grows_by_doubling_up_to_the_token_target():
    probe, probed = fake_device(limit_batch=1024, per_row_bytes=1 << 20)
    got = fit(8, probe, target_tokens=2**19, total_memory_bytes=80 << 30, base_memory_bytes=4 << 30)
    assert got.batch == 256 and probed == [8, 16, 32, 64, 128, 256]  # 256 x 2048 = 524,288 tokens
    assert got.step_downs == [] and "reached the target" in got.growth[-1]


def test_growth_stops_before_the_memory_headroom():
    probe, probed = fake_device(limit_batch=1024)  # 1 GiB per row: 80 GiB holds about 70 rows
    got = fit(8, probe, target_tokens=2**19, total_memory_bytes=80 << 30, base_memory_bytes=4 << 30)
    # 64 rows peak at 68 GiB (fits the 73.6 GiB usable); 128 would need ~132 GiB: never probed
    assert got.batch == 64 and probed == [8, 16, 32, 64]
    assert "batch 128 would need" in got.growth[-1]


def test_growth_stops_at_an_out_of_memory_error():
    probe, probed = fake_device(limit_batch=40, per_row_bytes=1 << 20)
    got = fit(8, probe, target_tokens=2**19, total_memory_bytes=80 << 30, base_memory_bytes=4 << 30)
    assert got.batch == 32 and probed == [8, 16, 32, 64] and "out of memory at batch 64" in got.growth[-1]


def test_halves_until_it_fits_and_then_never_grows_back():
    probe, probed = fake_device(limit_batch=3)
    got = fit(16, probe, target_tokens=2**19, total_memory_bytes=80 << 30)
    assert got.batch == 2 and probed == [16, 8, 4, 2] and len(got.step_downs) == 3


def test_without_a_target_the_batch_stays():
    probe, probed = fake_device(limit_batch=1024)
    assert fit(8, probe).batch == 8 and probed == [8]


def test_batch_one_not_fitting_is_an_error():
    probe, _ = fake_device(limit_batch=0)
    with pytest.raises(BatchDoesNotFit):
        fit(4, probe)


def test_the_engines_probes_run_eager_kernels_and_compile_comes_after_the_fit(monkeypatch):
    """docs/engine.md and runner.py say the probes are eager (compiling once per probed batch would cost minutes):
    the model and the optimizer updates both, and torch.compile is swapped in only after the fit."""
    from tests.engine.conftest import end_of, run_engine
    from tuner.engine import compiled, optim
    from tuner.engine.runner import Engine

    order: list[tuple] = []
    real_probe = Engine._oom_probe

    def probe(self, batch):
        order.append(("probe", batch, self.train_model is self.model,
                      optim._KERNELS["muon"] is optim.muon_update and optim._KERNELS["adamw"] is optim.adamw_update))
        return real_probe(self, batch)

    def compile_model(model):  # stands in for Inductor (minutes on the CPU); what matters is when it is called
        order.append(("compile",))
        return model

    monkeypatch.setattr(Engine, "_oom_probe", probe)
    monkeypatch.setattr(compiled, "compile_model", compile_model)
    optim.compile_updates()  # as an earlier compiled run in this process would leave them
    try:
        code, events, _ = run_engine(steps=1, compile=True)
    finally:
        optim.eager_updates()
    assert code == 0, end_of(events)
    assert order == [("probe", 8, True, True), ("compile",)]


def compiled_device(limit_batch: int, per_row_bytes: int = 1 << 30, base: int = 4 << 30):
    """The compiled step's probe: like `fake_device`, with its own limit (fused kernels keep fewer temporaries)."""
    return fake_device(limit_batch, per_row_bytes, base)


def test_the_compiled_probe_takes_the_doubling_the_eager_memory_prediction_refused():
    """An H200's case: eager 64 peaks high enough that 128 is predicted not to fit; the compiled step at 128 fits
    (the fused loss keeps one copy of the logits), so the training runs nanochat's own batch."""
    probe, probed = fake_device(limit_batch=1024)  # 1 GiB a row eager
    compiled, tried = compiled_device(limit_batch=1024, per_row_bytes=1 << 29)  # half of that compiled
    got = fit(8, probe, target_tokens=2**18, total_memory_bytes=140 << 30, base_memory_bytes=4 << 30,
              compiled_probe=compiled)
    assert got.batch == 128 and probed == [8, 16, 32, 64] and tried == [128] and got.compiled_fit
    assert "would need" in got.growth[-3] and "fits with the compiled kernels" in got.growth[-2]
    assert "reached the target" in got.growth[-1] and got.step_downs == []


def test_the_compiled_probe_takes_the_doubling_that_ran_out_of_memory_eager():
    probe, probed = fake_device(limit_batch=64, per_row_bytes=1 << 20)
    compiled, tried = compiled_device(limit_batch=128, per_row_bytes=1 << 20)
    got = fit(8, probe, target_tokens=2**19, total_memory_bytes=140 << 30, compiled_probe=compiled)
    # the compiled probe has its one try: the growth ends there even though the target allows 256
    assert got.batch == 128 and probed == [8, 16, 32, 64, 128] and tried == [128]


def test_a_compiled_probe_that_runs_out_of_memory_too_keeps_the_eager_fit():
    probe, probed = fake_device(limit_batch=64, per_row_bytes=1 << 20)
    compiled, tried = compiled_device(limit_batch=64, per_row_bytes=1 << 20)
    oom_calls = []
    got = fit_batch(8, probe, lambda e: isinstance(e, _Oom), lambda: oom_calls.append(1), seq_len=2048,
                    target_tokens=2**19, total_memory_bytes=140 << 30, compiled_probe=compiled)
    assert got.batch == 64 and probed == [8, 16, 32, 64, 128] and tried == [128] and not got.compiled_fit
    assert len(oom_calls) == 2  # the eager doubling's and the compiled try's: each cleaned up after
    assert got.growth[-2:] == ["out of memory at batch 128 with the compiled kernels too", "staying at 64"]


def test_a_compiled_step_over_the_headroom_is_not_taken():
    probe, _ = fake_device(limit_batch=64)
    compiled, tried = compiled_device(limit_batch=1024)  # runs at 128, at 132 GiB of a 140 GiB card
    got = fit(8, probe, target_tokens=2**19, total_memory_bytes=140 << 30, base_memory_bytes=4 << 30,
              compiled_probe=compiled)
    assert got.batch == 64 and tried == [128] and "over the" in got.growth[-2]


def test_a_start_only_the_compiled_step_fits_is_kept_without_a_step_down():
    """`--batch-size 128` (or a reference's batch) on a card where only the compiled step fits it: no halving and
    no setup warning; before, it ran at 64 with an out-of-memory warning."""
    probe, probed = fake_device(limit_batch=64)
    compiled, tried = compiled_device(limit_batch=128)
    got = fit(128, probe, compiled_probe=compiled, step_down=False)
    assert got.batch == 128 and probed == [128] and tried == [128] and got.step_downs == []


def test_a_fixed_batch_that_does_not_fit_is_an_error_naming_it_not_a_step_down():
    probe, probed = fake_device(limit_batch=64)
    compiled, tried = compiled_device(limit_batch=64)
    with pytest.raises(BatchDoesNotFit) as e:
        fit(128, probe, compiled_probe=compiled, step_down=False)
    assert e.value.batch == 128 and probed == [128] and tried == [128]


def test_after_the_compiled_try_fails_at_the_start_the_eager_halving_goes_on_alone():
    probe, probed = fake_device(limit_batch=16)
    compiled, tried = compiled_device(limit_batch=32)
    got = fit(128, probe, target_tokens=2**19, total_memory_bytes=140 << 30, compiled_probe=compiled)
    assert got.batch == 16 and probed == [128, 64, 32, 16] and tried == [128] and len(got.step_downs) == 3


def _compiled_fit_run(monkeypatch, *, eager_limit: int, compiled_limit: int, **engine_kw):
    """The engine on the CPU as on a GPU that compiles: its probes run out of memory above `eager_limit` with eager
    kernels and above `compiled_limit` with the compiled step. Returns (code, events, what was called, in order)."""
    from tests.engine.conftest import run_engine
    from tuner.engine import compiled
    from tuner.engine.platform import make_oom
    from tuner.engine.runner import Engine

    calls: list[tuple] = []
    real_probe = Engine._oom_probe

    class Compiled:  # stands in for Inductor's wrapper (minutes on the CPU): another callable than the model
        def __init__(self, model):
            self.model = model

        def __call__(self, *a, **kw):
            return self.model(*a, **kw)

        def __len__(self):  # as torch/_dynamo/eval_frame.py OptimizedModule.__len__ of a module that is no container:
            # so `compiled or model` raises, as it did on the first GPU run of this fit
            raise TypeError(f"{type(self.model).__name__} does not support len()")

    def probe(self, batch, model=None):
        kind = "eager" if model is None else "compiled"
        calls.append((kind, batch))
        if batch > (eager_limit if model is None else compiled_limit):
            raise make_oom(f"out of memory ({kind}, batch {batch})")
        assert model is None or isinstance(model, Compiled)
        return real_probe(self, batch, model)

    def compile_model(model):
        calls.append(("compile",))
        return Compiled(model)

    monkeypatch.setattr(Engine, "_fit_compiled", lambda self: True)
    monkeypatch.setattr(Engine, "_oom_probe", probe)
    monkeypatch.setattr(compiled, "compile_model", compile_model)
    engine_kw.setdefault("compile", True)
    code, events, _ = run_engine(steps=2, **engine_kw)
    return code, events, calls


def test_the_engine_takes_a_batch_only_its_compiled_step_fits_and_keeps_that_compile(monkeypatch):
    from tests.engine.conftest import end_of, of

    code, events, calls = _compiled_fit_run(monkeypatch, eager_limit=4, compiled_limit=8)
    assert code == 0, end_of(events)
    assert calls == [("eager", 8), ("compile",), ("compiled", 8)]  # compiled once: the training runs that compile
    assert of(events, "start")[0]["batch_size"] == 8
    assert [w for w in of(events, "warning") if w["kind"] == "oom"] == [] and end_of(events)["setup_problems"] == []


def test_a_compiled_try_that_runs_out_of_memory_steps_down_eager_and_compiles_afresh(monkeypatch):
    from tests.engine.conftest import end_of, of

    code, events, calls = _compiled_fit_run(monkeypatch, eager_limit=2, compiled_limit=4)
    assert code == 0, end_of(events)
    # the lost try's compile is forgotten (torch._dynamo.reset), and the training compiles at the batch taken
    assert calls == [("eager", 8), ("compile",), ("compiled", 8), ("eager", 4), ("eager", 2), ("compile",)]
    assert of(events, "start")[0]["batch_size"] == 2
    assert [w["detail"] for w in of(events, "warning") if w["kind"] == "oom"] == [
        "out of memory at batch 8; stepped down to 4", "out of memory at batch 4; stepped down to 2"]


def test_compiled_steps_that_do_not_repeat_fall_back_to_eager_at_a_batch_the_eager_kernels_fit(monkeypatch):
    """Compile on by default (as on a GPU) took a batch only the compiled step fits; its steps then differ between
    two runs, so the engine falls back to eager kernels: at that batch they would run out of memory in the first
    step, so the fit runs again with eager probes only (stepping down, with its warnings)."""
    from tests.engine.conftest import end_of, of
    from tuner.engine.options import EngineOptions
    from tuner.engine.runner import Engine

    checks: list[int] = []

    def step_check(self):  # the first (compiled) check differs; the eager one after the fallback agrees
        checks.append(self.batch_size)
        return "steps" if len(checks) == 1 else None

    monkeypatch.setattr(EngineOptions, "compile_enabled", lambda self, device_type: True)
    monkeypatch.setattr(Engine, "_step_check", step_check)
    code, events, calls = _compiled_fit_run(monkeypatch, eager_limit=4, compiled_limit=8, compile=None)
    assert code == 0, end_of(events)
    assert calls == [("eager", 8), ("compile",), ("compiled", 8), ("eager", 8), ("eager", 4)] and checks == [8, 4]
    start = of(events, "start")[0]
    assert start["batch_size"] == 4 and start["compile"] is False
    assert [w["kind"] for w in of(events, "warning")] == ["compile", "oom"]

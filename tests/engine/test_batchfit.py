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

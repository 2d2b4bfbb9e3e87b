"""Fault-injection primitives and the reference file, on their own."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tuner.engine import reference
from tuner.engine.faults import FaultInjector, flip_bit_, set_nan_
from tuner.engine.model import GPT, GPTConfig
from tuner.engine.options import Injection
from tuner.engine.reference import (
    Reference,
    ReferenceProblem,
    digest_values,
    fingerprint_diff,
    load_reference,
    save_reference,
    step_digest,
)


@given(value=st.floats(width=32, allow_nan=False, allow_infinity=False), bit=st.integers(0, 31))
def test_flip_bit_twice_is_identity_and_once_changes_exactly_one_bit(value, bit):
    t = torch.tensor([0.0, value, 0.0], dtype=torch.float32)
    before_bits = int(t.view(torch.int32)[1])
    flip_bit_(t, 1, bit)
    assert (int(t.view(torch.int32)[1]) ^ before_bits) & 0xFFFFFFFF == 1 << bit
    assert t[0] == 0 and t[2] == 0
    flip_bit_(t, 1, bit)
    assert int(t.view(torch.int32)[1]) == before_bits


def test_flip_bit_bf16_and_nan():
    t = torch.ones(4, dtype=torch.bfloat16)
    flip_bit_(t, 2, 15)
    assert float(t[2]) == -1.0 and float(t[1]) == 1.0
    u = torch.zeros(3)
    assert set_nan_(u, 1) == 0.0
    assert math.isnan(float(u[1])) and float(u[0]) == 0.0


def _model():
    m = GPT(GPTConfig(depth=1, width=32, head_dim=16, seq_len=16))
    m.init_weights(torch.Generator().manual_seed(0))
    return m


def test_explicit_weight_flip_happens_once_at_its_step():
    m = _model()
    inj = FaultInjector([Injection("bitflip", 3)], seed=5, log=lambda s: None)
    snap = {n: p.detach().clone() for n, p in m.named_parameters()}
    for step in (1, 2):
        inj.before_train_step(step, m)
        inj.disarm()
    assert all(torch.equal(p, snap[n]) for n, p in m.named_parameters())
    inj.before_train_step(3, m)
    changed = [n for n, p in m.named_parameters() if not torch.equal(p, snap[n])]
    assert len(changed) == 1 and changed[0].startswith("blocks.")
    rec = inj.records[0]
    assert (rec.step, rec.where, rec.bit, rec.source) == (3, "weight", 22, "inject")


def test_activation_flip_fires_in_the_next_forward_only():
    m = _model()
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    clean = m(x, x).detach()
    inj = FaultInjector([Injection("bitflip", 1, "activation", 30)], seed=1, log=lambda s: None)
    inj.before_train_step(1, m)
    dirty = m(x, x).detach()
    inj.disarm()
    assert not torch.equal(clean, dirty) and inj.records[0].where == "activation"
    assert torch.equal(m(x, x).detach(), clean)


def test_fault_rate_draws_depend_only_on_seed_and_step():
    def flips(seed, order):
        m = _model()
        inj = FaultInjector(fault_rate=0.5, seed=seed, log=lambda s: None)
        for step in order:
            inj.before_train_step(step, m)
            inj.disarm()
        return {(r.step, r.tensor, r.index, r.bit) for r in inj.records if r.where == "weight"}

    assert flips(3, range(1, 40)) == flips(3, reversed(range(1, 40)))
    assert flips(3, range(1, 40)) != flips(4, range(1, 40))
    assert flips(3, range(1, 40))  # some weight flips at P = 0.5


def test_reference_file_round_trip_and_damage(tmp_path):
    ref = Reference({"seed": 0, "batch_size": 8}, [step_digest(5.5, 1.0), step_digest(4.0, 0.5)], "ab" * 8)
    path = tmp_path / "sub" / "ref.json"
    save_reference(path, ref)
    back = load_reference(path)
    assert back.steps == 2 and back.digests == ref.digests and back.canary == ref.canary
    assert digest_values(back.digests[1]) == (4.0, 0.5)
    doc = json.loads(path.read_text())
    assert doc["format"] == "tuner-engine-reference" and doc["steps"] == 2
    for damage in ({"format": "x"}, {"version": 99}, {"steps": 5}, {"digests": ["zz"]}, {"fingerprint": None}):
        path.write_text(json.dumps({**doc, **damage}))
        with pytest.raises(ReferenceProblem):
            load_reference(path)
    path.write_text("{not json")
    with pytest.raises(ReferenceProblem, match="unreadable"):
        load_reference(path)
    with pytest.raises(ReferenceProblem, match="no such file"):
        load_reference(tmp_path / "nope.json")


def test_a_reference_over_the_cap_is_refused_in_one_line_before_it_is_parsed(tmp_path, monkeypatch):
    """A reference file is read as every file someone else chose (kernel_files.read_regular): only a regular file,
    and at most the cap a bundle inflates to, so a huge file is said, not read whole into memory."""
    path = tmp_path / "ref.json"
    save_reference(path, Reference({"seed": 0}, [step_digest(5.5, 1.0)] * 50, "ab" * 8))
    monkeypatch.setattr(reference, "MAX_FILE_BYTES", path.stat().st_size - 1)
    with pytest.raises(ReferenceProblem, match=r"^--reference '.*ref\.json': larger than 0 MiB; not a reference file$"):
        load_reference(path)


def test_fingerprint_diff_names_what_changed():
    assert fingerprint_diff({"a": 1, "b": 2}, {"a": 1, "b": 2}) == []
    assert fingerprint_diff({"seed": 0}, {"seed": 1, "x": 2}) == ["seed: reference 0, this run 1",
                                                                   "x: reference None, this run 2"]

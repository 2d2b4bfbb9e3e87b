"""The model, the optimizer and the data, each on its own."""

from __future__ import annotations

import math

import pytest
import torch

from tuner.engine.data import DataProblem, WindowSampler, load_corpus
from tuner.engine.model import GPT, GPTConfig
from tuner.engine.optim import build_optimizers, newton_schulz

CFG = GPTConfig(depth=2, width=64, head_dim=32, seq_len=32)


def make_model(seed: int = 0) -> GPT:
    m = GPT(CFG)
    m.init_weights(torch.Generator().manual_seed(seed))
    return m


def test_initial_loss_is_about_uniform_over_bytes():
    m = make_model()
    x = torch.randint(0, 256, (4, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    loss = float(m(x, x).detach())
    assert abs(loss - math.log(256)) < 0.1


def test_attention_is_causal():
    m = make_model()
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (1, CFG.seq_len), generator=g)
    y = torch.randint(0, 256, (1, CFG.seq_len), generator=g)
    before = m(x, y, "none")
    x2 = x.clone()
    x2[0, 20:] = (x2[0, 20:] + 1) % 256
    after = m(x2, y, "none")
    assert torch.equal(before[0, :20], after[0, :20])
    assert not torch.equal(before[0, 20:], after[0, 20:])


def test_nanochat_shape_rules():
    m = make_model()
    names = dict(m.named_parameters())
    assert all("bias" not in n for n in names)
    assert m.wte.weight.data_ptr() != m.lm_head.weight.data_ptr()  # untied
    assert all(p.dtype == torch.float32 for p in m.parameters())  # fp32 master weights
    assert len(m.matrix_params()) == CFG.depth * 6
    assert m.flops_per_token() > 6 * sum(p.numel() for p in m.matrix_params())


def test_compute_dtype_casts_activations_not_weights():
    m = make_model()
    m.set_compute_dtype(torch.bfloat16)
    x = torch.randint(0, 256, (2, CFG.seq_len))
    loss = m(x, x)
    assert loss.dtype == torch.float32 and math.isfinite(float(loss.detach()))
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_flattened_parameters_are_views_of_one_buffer():
    m = make_model()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    flat = m.flatten_parameters_()
    assert flat.numel() == sum(p.numel() for p in m.parameters())
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())
    with torch.no_grad():
        m.lm_head.weight[0, 0] = 7.0
    assert (flat == 7.0).sum() == 1
    m.load_state_dict({n: v for n, v in before.items()})
    assert (flat == 7.0).sum() == 0  # load_state_dict copies into the views


def test_newton_schulz_orthogonalises():
    g = torch.randn(3, 64, 256, generator=torch.Generator().manual_seed(0))
    x = newton_schulz(g)
    s = torch.linalg.svdvals(x)
    assert s.min() > 0.5 and s.max() < 1.3  # the quintic iteration's band, not exact


def test_optimizers_update_every_parameter():
    m = make_model()
    muon, adam = build_optimizers(m)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    x = torch.randint(0, 256, (4, CFG.seq_len), generator=torch.Generator().manual_seed(3))
    m(x, x).backward()
    muon.step()
    adam.step()
    changed = [n for n, p in m.named_parameters() if not torch.equal(p, before[n])]
    assert set(changed) == set(before)


def test_stdlib_corpus_and_deterministic_windows():
    corpus = load_corpus(max_bytes=256 * 1024)
    assert corpus.source == "stdlib" and corpus.nbytes == 256 * 1024 and corpus.files > 1
    assert b"def " in bytes(corpus.data[:65536].tolist())
    a, b = WindowSampler(corpus, 64, seed=1), WindowSampler(corpus, 64, seed=1)
    xa, ya = a.train_batch(7, 4)
    xb, yb = b.train_batch(7, 4)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(xa[:, 1:], ya[:, :-1])  # targets are the next bytes
    assert not torch.equal(a.train_batch(8, 4)[0], xa)
    assert not torch.equal(WindowSampler(corpus, 64, seed=2).train_batch(7, 4)[0], xa)
    hx, _ = a.heldout_batch(8)
    assert torch.equal(hx, WindowSampler(corpus, 64, seed=99).heldout_batch(8)[0])  # fixed, seed-independent


def test_user_data_file_and_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"hello world " * 800)
    (tmp_path / "d" / "b.txt").write_bytes(b"other text " * 800)
    c = load_corpus(str(tmp_path / "d"))
    assert c.files == 2 and c.nbytes == 12 * 800 + 11 * 800
    assert load_corpus(str(tmp_path / "d" / "a.txt")).files == 1
    with pytest.raises(DataProblem, match="no such file"):
        load_corpus(str(tmp_path / "missing"))
    (tmp_path / "small.txt").write_bytes(b"x" * 100)
    with pytest.raises(DataProblem, match="need at least"):
        load_corpus(str(tmp_path / "small.txt"))

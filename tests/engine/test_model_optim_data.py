"""The model, the optimizer and the data, each on its own."""

from __future__ import annotations

import math

import pytest
import torch

from tuner.engine.data import DataProblem, WindowSampler, load_corpus
from tuner.engine.model import GPT, GPTConfig
from tuner.engine.optim import build_optimizers, polar_express

CFG = GPTConfig(depth=2, width=64, head_dim=32, seq_len=32)


def make_model(seed: int = 0, compute_dtype: torch.dtype = torch.float32) -> GPT:
    m = GPT(CFG, compute_dtype)
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
    m = make_model(compute_dtype=torch.bfloat16)
    x = torch.randint(0, 256, (2, CFG.seq_len))
    loss = m(x, x)
    assert loss.dtype == torch.float32 and math.isfinite(float(loss.detach()))
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_flattened_parameters_are_views_of_one_buffer():
    m = make_model()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    (flat,) = m.flatten_parameters_()  # fp32 only: one buffer
    assert flat.numel() == sum(p.numel() for p in m.parameters())
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())
    with torch.no_grad():
        m.lm_head.weight[0, 0] = 7.0
    assert (flat == 7.0).sum() == 1
    m.load_state_dict(dict(before.items()))
    assert (flat == 7.0).sum() == 0  # load_state_dict copies into the views


def test_polar_express_orthogonalises():
    g = torch.randn(3, 64, 256, generator=torch.Generator().manual_seed(0))
    x = polar_express(g)
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


NANO = GPTConfig(depth=4, width=64, head_dim=32, seq_len=1024, vocab=512, window_pattern="SSSL", value_embeds=True)


def test_sliding_windows_follow_nanochat_pattern():
    assert NANO.windows() == [256, 256, 256, 1024]  # a quarter of the context, ceil 128; the last layer full
    cfg = GPTConfig(depth=6, width=384, head_dim=128, seq_len=2048, vocab=32768, window_pattern="SSSL")
    assert cfg.windows() == [512, 512, 512, 2048, 512, 2048]


def test_value_embeddings_on_alternate_layers_last_included():
    m = GPT(NANO)
    assert sorted(m.value_embeds) == ["1", "3"]
    assert [b.attn.ve_gate is not None for b in m.blocks] == [False, True, False, True]


def test_windowed_attention_does_not_see_past_its_window():
    cfg = GPTConfig(depth=2, width=64, head_dim=32, seq_len=1024, vocab=512, window_pattern="SL")
    m = GPT(cfg)
    m.init_weights(torch.Generator().manual_seed(0))
    block = m.blocks[0]  # window 256
    x = torch.randn(1, 600, 64, generator=torch.Generator().manual_seed(1))
    cos, sin = m.cos[:, :600], m.sin[:, :600]
    before = block(x, cos, sin, None, m.mask_256)
    x2 = x.clone()
    x2[0, 0] += 5.0  # position 0 is more than 256 back from position 599
    after = block(x2, cos, sin, None, m.mask_256)
    assert torch.equal(before[0, 300:], after[0, 300:])
    assert not torch.equal(before[0, :200], after[0, :200])


def test_bf16_embeddings_flatten_into_two_buffers_and_train():
    m = GPT(NANO, embed_dtype=torch.bfloat16)
    m.init_weights(torch.Generator().manual_seed(0))
    assert m.wte.weight.dtype == torch.bfloat16 and m.value_embeds["1"].weight.dtype == torch.bfloat16
    bufs = m.flatten_parameters_()
    assert sorted(str(b.dtype) for b in bufs) == ["torch.bfloat16", "torch.float32"]
    muon, adam = build_optimizers(m, lr_warmup_steps=4, momentum_warmup_steps=10, weight_decay=0.2)
    x = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(3))
    before = m.wte.weight.detach().clone()
    for _ in range(2):
        m(x, x).backward()
        muon.step()
        adam.step()
        m.zero_grad(set_to_none=True)
    assert m.wte.weight.dtype == torch.bfloat16 and not torch.equal(before, m.wte.weight)
    assert adam.state[0][0][0].dtype == torch.float32  # moments in fp32


def test_flops_count_the_head_and_the_windows():
    cfg = GPTConfig(depth=6, width=384, head_dim=128, seq_len=2048, vocab=32768, window_pattern="SSSL",
                    value_embeds=True)
    m = GPT(cfg)
    head = 6 * 384 * 32768
    assert 160e6 < m.flops_per_token() < 175e6  # about 168 M, as the issue computes
    assert 0.5 < head / (m.flops_per_token() - 12 * 384 * (4 * 512 + 2 * 2048)) < 0.6  # the head: ~54 %


def test_warmup_schedules():
    from tuner.engine.optim import muon_momentum, warmup_factor

    assert warmup_factor(1, 40) == 1 / 40 and warmup_factor(40, 40) == 1.0 and warmup_factor(5, 0) == 1.0
    assert muon_momentum(0, 300) == 0.85 and muon_momentum(300, 300) == 0.95 and muon_momentum(1, 0) == 0.95

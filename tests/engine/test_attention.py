"""tuner/engine/attention.py without a GPU: the kernel each layer gets per platform (the decision table), and the
flash-window path wired as nanochat runs it, checked on meta tensors (torch's flash ops have meta kernels): the
forward gets the window, autograd's backward gets the same window, and torch.compile's graphs call both."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode

from tuner.engine import attention
from tuner.engine.attention import AttentionPlatform
from tuner.engine.model import GPT, GPTConfig
from tuner.engine.options import PRESETS

NANOCHAT = PRESETS["nanochat"]
NANO_CFG = NANOCHAT  # a preset is a GPTConfig

# platform -> the nanochat preset's layers (windows 512, 512, 512, 2048, 512, 2048: "SSSL", the last layer long)
DECISION_TABLE = [
    ("CPU", attention.CPU, ["math-window"] * 3 + ["math", "math-window", "math"]),
    ("CUDA with flash", AttentionPlatform("cuda", rocm=False, flash_causal=True, flash_window_args=True),
     ["flash-window"] * 3 + ["flash", "flash-window", "flash"]),
    ("CUDA, flash does not take the shape/dtype (fp32, sm75)",
     AttentionPlatform("cuda", rocm=False, flash_causal=False, flash_window_args=True),
     ["math-window"] * 3 + ["math", "math-window", "math"]),
    ("CUDA with flash, a torch whose flash ops take no window",
     AttentionPlatform("cuda", rocm=False, flash_causal=True, flash_window_args=False),
     ["math-window"] * 3 + ["flash", "math-window", "flash"]),
    ("ROCm (flash built, not documented deterministic)",
     AttentionPlatform("cuda", rocm=True, flash_causal=True, flash_window_args=True),
     ["math-window"] * 3 + ["math", "math-window", "math"]),
    ("MPS", AttentionPlatform("mps", rocm=False, flash_causal=False, flash_window_args=True),
     ["math-window"] * 3 + ["math", "math-window", "math"]),
]


@pytest.mark.parametrize(("name", "where", "kernels"), DECISION_TABLE, ids=[row[0] for row in DECISION_TABLE])
def test_the_kernel_each_layer_gets_per_platform(name, where, kernels):
    assert NANO_CFG.windows() == [512, 512, 512, 2048, 512, 2048]
    assert attention.layer_kernels(NANO_CFG.windows(), NANO_CFG.seq_len, where) == kernels, name


def test_this_cpu_reads_as_the_cpu_row_and_its_torch_takes_window_sizes():
    where = attention.attention_platform("cpu", torch.device("cpu"), torch.float32, NANO_CFG.n_head,
                                         NANO_CFG.head_dim, NANO_CFG.seq_len)
    assert where == attention.CPU
    assert attention.flash_window_args()  # torch 2.13's schemas (and 2.11's): window_size_left/right


def test_the_default_model_keeps_the_cpu_kernels_and_a_mismatched_plan_is_refused():
    cfg = GPTConfig(depth=6, width=64, head_dim=32, seq_len=2048, window_pattern="SSSL")  # nanochat's windows
    assert GPT(cfg).attention_kernels == DECISION_TABLE[0][2]
    with pytest.raises(ValueError, match="do not fit"):
        GPT(cfg, attention_kernels=["flash"] * cfg.depth)  # a window layer given a full kernel


class _FlashCalls(TorchDispatchMode):
    """Records every flash op dispatched, with its window arguments."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int | None, int | None, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if "flash_attention" in name:
            self.calls.append((name.split(".")[1], kwargs.get("window_size_left"), kwargs.get("window_size_right"),
                               args[11 if "backward" in name else 8]))  # is_causal
        return func(*args, **kwargs)


def _small_windowed_model(kernels_for: AttentionPlatform) -> GPT:
    cfg = GPTConfig(depth=4, width=256, head_dim=128, seq_len=512, window_pattern="SSSL")
    kernels = attention.layer_kernels(cfg.windows(), cfg.seq_len, kernels_for)
    return GPT(cfg, torch.bfloat16, attention_kernels=kernels).to("meta")


def test_flash_window_layers_pass_their_window_to_the_forward_and_the_backward():
    cuda = DECISION_TABLE[1][1]
    model = _small_windowed_model(cuda)
    assert model.attention_kernels == ["flash-window", "flash-window", "flash-window", "flash"]
    idx = torch.zeros(2, 512, dtype=torch.long, device="meta")
    with _FlashCalls() as seen:
        model(idx, idx).backward()
    # 3 window layers (window 128 = a quarter of 512, rounded up to 128) run flash's own forward and backward;
    # the full layer's causal SDPA falls to the math kernel on meta tensors (no flash op)
    assert seen.calls == [("_flash_attention_forward", 128, 0, True)] * 3 + \
        [("_flash_attention_backward", 128, 0, True)] * 3


def test_math_window_layers_never_call_flash():
    model = _small_windowed_model(attention.CPU)
    idx = torch.zeros(2, 512, dtype=torch.long, device="meta")
    with _FlashCalls() as seen:
        model(idx, idx).backward()
    assert seen.calls == []


def test_torch_compile_traces_the_window_into_the_forward_and_backward_graphs():
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        from functorch.compile import make_boxed_func

        return make_boxed_func(gm.forward)

    def layer(q, k, v):
        return attention.attend(q, k, v, attention.FLASH_WINDOW, 128)

    q, k, v = (torch.randn(2, 512, 3, 128, device="meta", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(layer, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True,
                                 dynamic=False)
        compiled(q, k, v).sum().backward()
    finally:
        torch._dynamo.reset()
    flash = [(str(n.target), n.kwargs.get("window_size_left"), n.kwargs.get("window_size_right"))
             for g in graphs for n in g.graph.nodes if "flash_attention" in str(n.target)]
    assert flash == [("aten._flash_attention_forward.default", 128, 0),
                     ("aten._flash_attention_backward.default", 128, 0)]

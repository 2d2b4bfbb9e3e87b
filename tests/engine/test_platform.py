"""tuner/engine/platform.py without a GPU: the card chosen by PCI bus id among all visible devices (a fake
torch.cuda with three devices, the wanted one last, as HIP may number them), and the environment that makes
kernels deterministic."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from tuner.engine import environment, platform


@pytest.fixture
def three_gpus(monkeypatch):
    props = [SimpleNamespace(name=name, pci_domain_id=0, pci_bus_id=bus, pci_device_id=0, total_memory=2**34)
             for name, bus in (("AMD Radeon Graphics (iGPU)", 0x7C), ("GPU B", 0x03), ("GPU C", 0x83))]
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


def test_the_device_is_chosen_by_pci_bus_id_not_by_index(three_gpus):
    spec = platform.resolve_device("cuda:0", "0000:83:00.0")
    assert (spec.device, spec.name, spec.pci_bus_id) == (torch.device("cuda", 2), "GPU C", "0000:83:00.0")
    assert three_gpus == [2]  # made current: capability queries ask this device
    assert platform.resolve_device("cuda:0", "00000000:03:00.0").name == "GPU B"  # NVML's long domain


def test_no_device_with_the_bus_id_is_a_setup_problem(three_gpus):
    with pytest.raises(platform.SetupProblem, match=r"0000:44:00\.0.*0: 0000:7c:00\.0, 1: 0000:03:00\.0"):
        platform.resolve_device("cuda:0", "0000:44:00.0")


def test_without_a_bus_id_the_index_decides(three_gpus):
    assert platform.resolve_device("cuda:1").name == "GPU B"


def test_the_environment_is_made_deterministic(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    monkeypatch.setenv("PYTORCH_TUNABLEOP_ENABLED", "1")
    monkeypatch.delenv("TORCH_BLAS_PREFER_HIPBLASLT", raising=False)
    changed = environment.prepare_environment()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and os.environ["PYTORCH_TUNABLEOP_ENABLED"] == "0"
    assert os.environ["TORCH_BLAS_PREFER_HIPBLASLT"] == "0"
    assert len(changed) == 2 and "not deterministic" in changed[0]
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other deterministic value is kept
    assert environment.prepare_environment() == [] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.setenv("ROCBLAS_LAYER", "1")
    assert environment.kernel_env()["ROCBLAS_LAYER"] == "1" and "PATH" not in environment.kernel_env()


def test_the_engine_sets_its_environment_before_torch_is_imported(tmp_path):
    """The CUDA allocator, cuBLAS and TunableOp read their variables at import or first use: `python -m
    tuner.engine` sets them (and the compile caches) before anything imports torch."""
    import json
    import subprocess
    import sys

    from tests.cli_helpers import REPO

    seen = tmp_path / "seen.txt"
    code = (
        "import os, sys\n"
        "first = {}\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'torch' and not first:\n"
        "        first.update({k: os.environ.get(k) for k in ('PYTORCH_CUDA_ALLOC_CONF', 'CUBLAS_WORKSPACE_CONFIG',"
        " 'PYTORCH_TUNABLEOP_ENABLED', 'TORCHINDUCTOR_CACHE_DIR')})\n"
        "sys.addaudithook(hook)\n"
        "from tuner.engine.cli import main\n"
        f"code = main(['--steps', '1', '--cache-dir', {str(tmp_path / 'cache')!r}])\n"
        f"import json; open({str(seen)!r}, 'w').write(json.dumps(first))\n"
        "sys.exit(code)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_TUNABLEOP_ENABLED",
                        "TORCHINDUCTOR_CACHE_DIR")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(seen.read_text()) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "PYTORCH_TUNABLEOP_ENABLED": "0", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "engine" / "inductor")}


def test_the_engine_runs_on_the_card_resolve_device_matched(three_gpus, monkeypatch, tmp_path):
    """`--expect-pci-bus-id 03:00.0` names the card reporting `0000:03:00.0`: resolve_device matched it, and setup
    (which compared the two again as exact strings, and refused) agrees; a CPU device is still not the card."""
    from tuner.engine import compiled, runner
    from tuner.engine.options import EngineOptions
    from tuner.engine.protocol import Emitter

    class PastTheCheck(Exception):
        pass

    def past(*args):
        raise PastTheCheck

    monkeypatch.setattr(compiled, "prepare_environment", lambda root: [])  # this process's environment stays
    monkeypatch.setattr(runner, "choose_kernels", lambda spec: {})
    monkeypatch.setattr(runner, "choose_dtype", past)  # the next step of setup after the bus id check

    def setup(device: str) -> None:
        opts = EngineOptions(device=device, expect_pci_bus_id="03:00.0", steps=1, cache_dir=str(tmp_path),
                             threads=torch.get_num_threads())  # as many as now: setup sets them
        runner.Engine(opts, Emitter(sink=lambda ev: None), log=lambda msg: None).setup()

    with pytest.raises(PastTheCheck):
        setup("cuda:0")
    assert three_gpus == [1]  # GPU B, at 0000:03:00.0
    with pytest.raises(platform.SetupProblem, match=r"--device cpu is CPU.* not the expected 03:00\.0"):
        setup("cpu")


@pytest.mark.parametrize("message, said", [("", "none (RuntimeError)"),
                                           ("No available kernel.\nAborting.", "none (No available kernel.)")])
def test_an_sdpa_backend_that_cannot_be_chosen_is_said_in_one_line(monkeypatch, message, said):
    """A RuntimeError with no text used to raise IndexError out of sdpa_backend (its first line was read blindly)."""
    def no_kernel(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(torch, "_fused_sdp_choice", no_kernel, raising=False)
    assert platform.sdpa_backend(torch.zeros(1, 1, 4, 8)) == said

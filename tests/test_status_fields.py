"""`tuner status` says what the dashboard says: clock-limit reasons the backend cannot read are `limits: n/a` (JSON
`"throttle_reasons": null`), never `limits: none` / `[]` (which claim that none are active); fan %, VRAM and the
power cap are shown when the card reports them and `n/a` (null) when it does not.

The simulated AMD-style and NVIDIA-style cards read every figure; the real AMD backend over a fake sysfs tree cannot
read the reasons (they live only in the binary gpu_metrics), nor can the real NVIDIA backend when the driver refuses
both NVML calls (the fake pynvml)."""

from __future__ import annotations

import json

import pytest

from tests.backends.fakes.fake_pynvml import CODES, FakeGpu, make_fake_nvml
from tests.backends.fakes.trees import make_tree
from tests.profiles.helpers import tuner
from tuner.backends import amd, nvidia
from tuner.backends.simulated import SimulatedBackend

REASON_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")


def status(capsys, *argv: str) -> tuple[str, dict]:
    """`tuner status` on the first card, in words and as JSON (the same backend for both)."""
    code, human, err = tuner(capsys, *argv, "status")
    assert code == 0 and "Traceback" not in err, err
    code, out, err = tuner(capsys, *argv, "status", "--json")
    assert code == 0, err
    return human, json.loads(out)["devices"][0]["telemetry"]


def lines_of(human: str) -> dict[str, str]:
    """`  label   value` lines as {label: value}; `limits: x` as {"limits": x}."""
    out = {}
    for line in human.splitlines()[1:]:
        label, _, value = line.strip().partition(": ") if line.strip().startswith("limits:") else (
            line[:15].strip(), None, line[15:].strip())
        out[label] = value
    return out


@pytest.fixture
def backend_is(monkeypatch):
    """Make the CLI open a real backend over fakes (`open()` builds a fresh one each time: the CLI closes what it
    opened) instead of probing the machine."""
    return lambda open_: monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_kw: open_())


def _nvidia(*, fail: dict[str, str] | None = None, **gpu):
    """The real NVIDIA backend over a fake pynvml whose `fail` calls answer with that NVML error."""
    return lambda: nvidia.discover(make_fake_nvml([FakeGpu(**gpu)], fail={
        call: CODES[code] for call, code in (fail or {}).items()}))


# --- reasons the backend cannot read --------------------------------------------------------------------------------
def test_amd_cannot_read_the_reasons_so_status_says_na_and_json_null(capsys, tmp_path, backend_is):
    make_tree(tmp_path, ["rdna4"])
    backend_is(lambda: amd.discover(root=tmp_path))
    human, doc = status(capsys)
    assert lines_of(human)["limits"] == "n/a" and "limits: none" not in human
    assert doc["throttle_reasons"] is None
    # the figures AMD does read are still there, in the kernel's units
    assert lines_of(human)["fan"].endswith("(1100 rpm)") and lines_of(human)["fan"] != "n/a"
    assert doc["fan_pct"] is not None and doc["vram_total_mib"] is not None


def test_nvidia_refusing_both_reason_calls_says_na_and_json_null(capsys, backend_is):
    backend_is(_nvidia(fail=dict.fromkeys(REASON_CALLS, "NVML_ERROR_NOT_SUPPORTED")))
    human, doc = status(capsys)
    assert lines_of(human)["limits"] == "n/a"
    assert doc["throttle_reasons"] is None


def test_nvidia_with_no_reason_active_says_none_and_json_empty(capsys, backend_is):
    backend_is(_nvidia(reasons=0))
    human, doc = status(capsys)
    assert lines_of(human)["limits"] == "none"
    assert doc["throttle_reasons"] == []


def test_nvidia_active_reasons_are_named(capsys, backend_is):
    backend_is(_nvidia(reasons=0x4 | 0x40))
    human, doc = status(capsys)
    assert lines_of(human)["limits"] == "power cap, hw thermal"
    assert doc["throttle_reasons"] == ["power cap", "hw thermal"]


# --- fan %, VRAM and power cap ------------------------------------------------------------------------------------
def test_nvidia_fan_vram_and_power_cap_in_words_and_json(capsys, backend_is):
    backend_is(_nvidia())
    human, doc = status(capsys)
    fields = lines_of(human)
    assert (fields["fan"], fields["VRAM"], fields["power cap"]) == ("30 %", "1.5/24 GiB", "350 W")
    assert (doc["fan_pct"], doc["vram_used_mib"], doc["vram_total_mib"], doc["power_limit_w"]) == (
        30, 1536, 24564, 350.0)


def test_a_figure_the_card_does_not_report_is_na_and_null(capsys, backend_is):
    """A fanless board (NotSupported) and a driver refusing the memory and power-limit reads."""
    refused = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetEnforcedPowerLimit")
    backend_is(_nvidia(name="NVIDIA H200", fan_pct=None, fail=dict.fromkeys(refused, "NVML_ERROR_NO_PERMISSION")))
    human, doc = status(capsys)
    fields = lines_of(human)
    assert (fields["fan"], fields["VRAM"], fields["power cap"]) == ("n/a", "n/a", "n/a")
    assert (doc["fan_pct"], doc["vram_used_mib"], doc["vram_total_mib"], doc["power_limit_w"]) == (
        None, None, None, None)
    assert fields["limits"] == "power cap"  # the rest still reads


@pytest.mark.parametrize("kind", ["amd", "nvidia"])
def test_simulated_cards_show_every_figure(capsys, kind):
    human, doc = status(capsys, "--simulate", "--sim-kind", kind)
    assert "[SIMULATED]" in human.splitlines()[0]
    sample = SimulatedBackend(kind=kind).telemetry("sim0")  # what the card reads, in the same units
    fields = lines_of(human)
    assert fields["fan"].endswith(" rpm)") and fields["fan"].split()[1] == "%"
    assert fields["VRAM"].endswith(f"/{sample.vram_total_mib / 1024:.0f} GiB")
    assert fields["power cap"] == f"{sample.power_limit_w:.0f} W"
    if kind == "amd":  # as the real amdgpu backend: the reasons are not readable (docs/backends.md)
        assert fields["limits"] == "n/a" and doc["throttle_reasons"] is None
    else:  # NVML reads them, so never n/a
        assert fields["limits"] in ("none", "power cap") and doc["throttle_reasons"] in ([], ["power cap"])
    assert None not in (doc["fan_pct"], doc["vram_used_mib"], doc["vram_total_mib"], doc["power_limit_w"])

"""Hardware error counters for the screen's evidence, read-only: NVML's volatile ECC counts and row remapping,
amdgpu's ras/*_err_count, nothing (with why) where a card has none: never a 0 the driver did not report."""

from __future__ import annotations

from tests.backends.fakes.fake_pynvml import CODES, FakeGpu, make_fake_nvml
from tests.backends.fakes.trees import make_tree, write
from tuner.backends import amd, nvidia
from tuner.backends.amd_sysfs import amd_card_dirs
from tuner.backends.simulated import SimulatedBackend


def _nvidia(gpu, **kw):
    m = make_fake_nvml([gpu], **kw)
    backend = nvidia.discover(m)
    return m, backend, backend.devices()[0].id


def test_nvml_ecc_and_row_remapping_are_read():
    gpu = FakeGpu(name="NVIDIA H200", ecc={(0, 0): 3, (1, 0): 0}, remapped_rows=(2, 0, 0, 0))
    m, backend, dev = _nvidia(gpu)
    c = backend.error_counters(dev)
    assert c.source == "nvml" and c.available
    assert c.as_dict() == {"ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0,
                           "remapped_rows_correctable": 2, "remapped_rows_uncorrectable": 0, "remap_pending": 0,
                           "remap_failure": 0}
    assert not any(name.startswith("nvmlDeviceSet") for name, *_ in m.calls)  # reads only


def test_a_geforce_without_ecc_has_none_never_zero():
    _m, backend, dev = _nvidia(FakeGpu())
    c = backend.error_counters(dev)
    assert not c.available and c.counts == () and "no ECC" in (c.why or "")


def test_ecc_without_row_remapping_names_what_is_missing():
    _m, backend, dev = _nvidia(FakeGpu(ecc={(1, 0): 1}))
    c = backend.error_counters(dev)
    assert c.as_dict() == {"ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 1}
    assert "remap_pending" in c.unreadable


def test_nvml_refusing_a_counter_leaves_it_out():
    _m, backend, dev = _nvidia(FakeGpu(ecc={}), fail={"nvmlDeviceGetTotalEccErrors": CODES["NVML_ERROR_NO_PERMISSION"]})
    c = backend.error_counters(dev)
    assert "ecc_uncorrected_volatile" not in c.as_dict()


def _amd(tmp_path, ras: dict[str, str] | None):
    make_tree(tmp_path, ["rdna4"])
    [card] = amd_card_dirs(tmp_path)
    if ras is not None:
        for name, text in ras.items():
            write(card / "ras" / name, text)
    backend = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path)
    return backend, backend.devices()[0].id


def test_amdgpu_ras_counts_per_block(tmp_path):
    backend, dev = _amd(tmp_path, {"umc_err_count": "ue: 0\nce: 4\nde: 1\n", "gfx_err_count": "ue: 1\nce: 0\n",
                                   "features": "feature mask: 0x3fff\n",
                                   "sdma_err_count": "Query currently inaccessible\n"})
    c = backend.error_counters(dev)
    assert c.source == "amdgpu ras"
    assert c.as_dict() == {"ras_gfx_ue": 1, "ras_gfx_ce": 0, "ras_umc_ue": 0, "ras_umc_ce": 4, "ras_umc_de": 1}
    assert c.unreadable == ("ras_sdma",)


def test_a_consumer_radeon_without_ras_has_none(tmp_path):
    backend, dev = _amd(tmp_path, None)
    c = backend.error_counters(dev)
    assert not c.available and "no RAS" in (c.why or "")


def test_the_simulated_card_says_it_has_none(tmp_path):
    c = SimulatedBackend(state_path=tmp_path / "s.json").error_counters("sim0")
    assert not c.available and c.why

"""The portable reference bundle: written and read back, and every bad file is one BundleProblem (exit 2) that names
it and says what to do: another format version, cut, edited (hash), not gzip, an engine trajectory instead."""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec
import pytest

from tests.screen.helpers import bundle, raw, write_raw
from tuner import __version__
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.profiles import reference_bundle as rb


def test_round_trip_is_exact_and_compressed(tmp_path):
    b = bundle(tmp_path, steps=400)
    size = rb.write_bundle(b, tmp_path / "A.ref")
    back = rb.read_bundle(tmp_path / "A.ref")
    assert back == b
    assert (tmp_path / "A.ref").read_bytes()[:2] == b"\x1f\x8b"
    plain = len(gzip.decompress((tmp_path / "A.ref").read_bytes()))
    assert size < plain * 0.7  # hex digests compress
    assert rb.encode(b) == rb.encode(back)  # the same bundle, the same bytes (mtime 0)


def test_must_match_and_may_differ_fields(tmp_path):
    b = bundle(tmp_path)
    must = b.must_match()
    assert must["tuner_version"] == __version__
    for key in ("card.vendor", "card.model", "card.pci_id", "card.vbios_family", "card.driver_version",
                "engine.preset", "engine.batch_size", "engine.seed", "engine.dtype", "engine.data_sha256",
                "engine.torch_version", "engine.kernels", "engine.kernel_env", "engine.device_name"):
        assert key in must, key
    may = b.may_differ()
    assert set(may) == {"origin.host", "origin.device_id", "origin.pci_slot", "origin.serial", "origin.subsystem_id",
                        "origin.vbios", "origin.kernel", "origin.simulated"}
    assert not {k.split(".", 1)[1] for k in may} & {"model", "pci_id", "driver_version"}


def test_a_card_differs_only_where_it_must_match(tmp_path):
    b = bundle(tmp_path)
    other_seed = SimulatedBackend(state_path=tmp_path / "s2.json", seed=7)  # another serial: may differ
    assert rb.card_differences(b, other_seed.device("sim0")) == []
    new_driver = SimulatedBackend(state_path=tmp_path / "s3.json", driver="999.1")
    [d] = rb.card_differences(b, new_driver.device("sim0"))
    assert (d.field, d.reference, d.here) == ("card.driver_version", "simulated", "999.1")


def test_vbios_family_only_where_the_device_id_does_not_name_the_sku():
    assert rb.vbios_family("113-D7170100-100") == "113-D7170100"
    from tuner.core.models import DeviceInfo
    nv = DeviceInfo(id="0000:01:00.0", vendor="nvidia", name="NVIDIA H200", pci_id="10de:2335", vbios="96.00.A5")
    amd = DeviceInfo(id="0000:03:00.0", vendor="amd", name="R9700", pci_id="1002:7551", vbios="113-D7170100-100")
    assert rb.card_fields(nv).vbios_family is None
    assert rb.card_fields(amd).vbios_family == "113-D7170100"


@pytest.mark.parametrize("damage, words", [
    (lambda d: d.update(version=2), "bundle format version 2"),
    (lambda d: d["trajectory"]["digests"].__setitem__(1, "f" * 32), "does not match its hash"),
    (lambda d: d["card"].update(model="Radeon"), "does not match its hash"),
    (lambda d: d.update(format="something"), "not a tuner reference bundle"),
])
def test_bad_documents(tmp_path, damage, words):
    rb.write_bundle(bundle(tmp_path), tmp_path / "A.ref")
    doc = raw(tmp_path / "A.ref")
    damage(doc)
    write_raw(tmp_path / "B.ref", doc)
    with pytest.raises(rb.BundleProblem) as e:
        rb.read_bundle(tmp_path / "B.ref")
    assert words in e.value.one_line()
    assert str(tmp_path / "B.ref") in e.value.one_line()
    assert e.value.exit_code == exit_codes.USAGE


@pytest.mark.parametrize("number", [b"NaN", b"-Infinity", b"1" * 5000])
def test_a_number_json_does_not_have_is_one_bundle_problem(tmp_path, number):
    """Python's json reads NaN and Infinity (not JSON) and refuses integers over 4,300 digits with a ValueError: a
    hand-edited bundle with one of them escaped `read_bundle` (the content hash re-encodes with allow_nan=False) as
    a traceback instead of one line."""
    rb.write_bundle(bundle(tmp_path), tmp_path / "A.ref")
    text = gzip.decompress((tmp_path / "A.ref").read_bytes())
    (tmp_path / "B.ref").write_bytes(gzip.compress(text.replace(b'"bpb":null', b'"bpb":' + number)))
    assert b'"bpb":null' in text
    with pytest.raises(rb.BundleProblem) as e:
        rb.read_bundle(tmp_path / "B.ref")
    assert "damaged (its content is not JSON)" in e.value.one_line() and str(tmp_path / "B.ref") in e.value.message


def test_a_deeply_nested_bundle_is_one_bundle_problem(tmp_path):
    """A few hundred KiB of `[` inflate into JSON nested past Python's recursion limit: json.loads raised
    RecursionError, a traceback (the profile reader already says "nested too deeply" for its TOML)."""
    deep = b'{"format": "tuner-reference-bundle", "version": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (tmp_path / "B.ref").write_bytes(gzip.compress(deep))
    with pytest.raises(rb.BundleProblem) as e:
        rb.read_bundle(tmp_path / "B.ref")
    assert "damaged" in e.value.one_line() and str(tmp_path / "B.ref") in e.value.message


def test_a_newer_format_names_the_tuner_to_use(tmp_path):
    rb.write_bundle(bundle(tmp_path), tmp_path / "A.ref")
    doc = raw(tmp_path / "A.ref")
    doc.update(version=2, tuner_version="9.0")
    write_raw(tmp_path / "B.ref", doc)
    with pytest.raises(rb.BundleProblem) as e:
        rb.read_bundle(tmp_path / "B.ref")
    assert "written by tuner 9.0" in e.value.message and "use tuner 9.0 or newer" in e.value.remedy


def test_truncated_and_foreign_files(tmp_path):
    rb.write_bundle(bundle(tmp_path, steps=200), tmp_path / "A.ref")
    data = (tmp_path / "A.ref").read_bytes()
    (tmp_path / "cut.ref").write_bytes(data[: len(data) // 2])
    with pytest.raises(rb.BundleProblem, match="truncated or damaged"):
        rb.read_bundle(tmp_path / "cut.ref")
    (tmp_path / "traj.json").write_text('{"format": "tuner-engine-reference"}')
    with pytest.raises(rb.BundleProblem, match="an engine trajectory file"):
        rb.read_bundle(tmp_path / "traj.json")
    with pytest.raises(rb.BundleProblem, match="no such file"):
        rb.read_bundle(tmp_path / "missing.ref")
    with pytest.raises(rb.BundleProblem, match="is a directory"):
        rb.read_bundle(tmp_path)


def test_a_resealed_bundle_with_a_bad_trajectory_is_refused(tmp_path):
    """Someone who recomputes the hash still cannot hand the engine a damaged trajectory: its own rules apply."""
    doc = msgspec.to_builtins(bundle(tmp_path))
    doc["trajectory"]["digests"][2] = "xyz"
    rb.write_bundle(rb.seal(doc), tmp_path / "C.ref")
    with pytest.raises(rb.BundleProblem, match="damaged digest list"):
        rb.read_bundle(tmp_path / "C.ref")


def test_materialize_writes_what_the_engine_reads(tmp_path):
    from tuner.engine.reference import load_reference
    b = bundle(tmp_path, steps=7)
    path = rb.materialize(b, tmp_path)
    ref = load_reference(path)
    assert ref.steps == 7 and ref.fingerprint == b.engine_fingerprint


def test_write_refuses_to_replace_without_overwrite(tmp_path):
    b = bundle(tmp_path)
    rb.write_bundle(b, tmp_path / "A.ref")
    from tuner.core.errors import UsageError
    with pytest.raises(UsageError, match="already exists"):
        rb.write_bundle(b, tmp_path / "A.ref")
    rb.write_bundle(b, tmp_path / "A.ref", overwrite=True)


def test_a_fifo_or_a_device_node_is_refused_without_waiting(tmp_path):
    """`--reference` and NAME.ref beside a profile are paths a person types or copies: a FIFO there used to block
    the open until something wrote to it (a hung `tuner apply --verify`), /dev/zero was read up to the cap."""
    import concurrent.futures
    import os

    fifo = tmp_path / "pipe.ref"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "is a FIFO"), (Path("/dev/zero"), "is a device node")):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(rb.read_bundle, path)
            try:
                error = future.exception(timeout=20)
            except concurrent.futures.TimeoutError:
                with open(fifo, "wb"):  # let the blocked open return, so the test ends
                    pass
                raise AssertionError(f"read_bundle({path}) blocked") from None
        assert isinstance(error, rb.BundleProblem) and f"{path}: {kind}, not a file" in error.message, error


def test_a_path_through_a_file_or_a_link_loop_is_one_bundle_problem(tmp_path):
    """Any error opening the path is the one-line BundleProblem naming the file, not a raw OSError (ENOTDIR from a
    file used as a folder in the path, ELOOP from a link to itself)."""
    (tmp_path / "profile.toml").write_text("")
    loop = tmp_path / "loop.ref"
    loop.symlink_to(loop)
    for path, said in ((tmp_path / "profile.toml" / "x.ref", "not a directory"),
                       (loop, "too many levels of symbolic links")):
        with pytest.raises(rb.BundleProblem) as refused:
            rb.read_bundle(path)
        assert f"reference {path}: " in refused.value.message and said in refused.value.message.lower()


def test_record_checks_stock_under_the_card_lock(tmp_path, monkeypatch):
    """`reference record` refuses a card off stock: checked while it holds the card's writer lock, so a writer that
    changed the card just before the lock was taken (here, inside the lock's acquisition) is seen, and no reference
    of an undervolted card is recorded as a stock one."""
    from tuner.actions.screen import record
    from tuner.actions.screen.attribution import TIERS
    from tuner.core.errors import UsageError

    backend = SimulatedBackend(state_path=tmp_path / "sim")
    real_lock = record.CardLock

    class LateWriter(real_lock):  # another tuner's `set` landed between the check and this lock
        def __enter__(self):
            backend.apply("sim0", -20)
            return super().__enter__()

    monkeypatch.setattr(record, "CardLock", LateWriter)
    runs = []
    monkeypatch.setattr(record, "StressSession", lambda *a, **k: runs.append(a) or pytest.fail("an engine ran"))
    out = tmp_path / "A.ref"
    with pytest.raises(UsageError, match="not stock"):
        record.record_reference(backend, record.RecordRequest("sim0", TIERS["quick"], out))
    assert runs == [] and not out.exists()

"""A profile travels with its proof: `profile export` carries the stock reference beside it (NAME.ref, its size
said), `import` takes the one beside the file (checked first: a damaged one stores nothing), `delete` removes it,
`show` says it is there."""

from __future__ import annotations

import json

from tests.profiles.helpers import sim_profile, tuner
from tests.screen.helpers import bundle, raw, write_raw
from tuner.core import exit_codes
from tuner.profiles import reference_bundle as rb
from tuner.profiles.store import profile_path, save_profile


def _saved_with_reference(tmp_path, name="p"):
    path = save_profile(sim_profile(name))
    rb.write_beside(bundle(tmp_path, steps=300), path)
    return path


def test_export_carries_the_reference_and_says_its_size(tmp_path, capsys):
    _saved_with_reference(tmp_path)
    code, out, _ = tuner(capsys, "profile", "export", "p", str(tmp_path / "out.toml"))
    assert code == 0
    assert "stock reference" in out and str(tmp_path / "out.ref") in out and "KiB" in out
    assert rb.read_bundle(tmp_path / "out.ref").steps == 300


def test_export_without_one_says_so(tmp_path, capsys):
    save_profile(sim_profile("bare"))
    code, out, _ = tuner(capsys, "profile", "export", "bare", str(tmp_path / "b.toml"))
    assert code == 0 and "no stock reference" in out and not (tmp_path / "b.ref").exists()


def test_export_to_stdout_says_the_reference_is_not_carried(tmp_path, capsys):
    _saved_with_reference(tmp_path)
    code, out, err = tuner(capsys, "profile", "export", "p", "-")
    assert code == 0 and "[profile]" in out and "not carried on stdout" in err


def test_export_refuses_to_replace_a_reference_without_overwrite(tmp_path, capsys):
    _saved_with_reference(tmp_path)
    (tmp_path / "out.ref").write_text("keep me")
    code, _, err = tuner(capsys, "profile", "export", "p", str(tmp_path / "out.toml"))
    assert code == exit_codes.USAGE and "already exists" in err
    assert (tmp_path / "out.ref").read_text() == "keep me" and not (tmp_path / "out.toml").exists()


def test_import_takes_the_reference_beside_the_file(tmp_path, capsys):
    _saved_with_reference(tmp_path, "src")
    tuner(capsys, "profile", "export", "src", str(tmp_path / "x.toml"))
    code, out, _ = tuner(capsys, "profile", "import", str(tmp_path / "x.toml"), "--name", "moved", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["reference"]["sha256"] == rb.read_bundle(tmp_path / "x.ref").sha256
    assert rb.read_bundle(rb.sidecar_path(profile_path("moved"))).steps == 300
    code, out, _ = tuner(capsys, "profile", "show", "moved")
    assert "reference" in out and "300 stock steps" in out
    code, out, _ = tuner(capsys, "profile", "delete", "moved")
    assert "its stock reference" in out and not rb.sidecar_path(profile_path("moved")).exists()


def test_import_refuses_a_damaged_reference_and_stores_nothing(tmp_path, capsys):
    _saved_with_reference(tmp_path, "src")
    tuner(capsys, "profile", "export", "src", str(tmp_path / "x.toml"))
    doc = raw(tmp_path / "x.ref")
    doc["card"]["driver_version"] = "edited"
    write_raw(tmp_path / "x.ref", doc)
    code, _, err = tuner(capsys, "profile", "import", str(tmp_path / "x.toml"), "--name", "moved")
    assert code == exit_codes.USAGE and "does not match its hash" in err
    assert len(err.strip().splitlines()) == 1
    assert not profile_path("moved").exists()


def test_a_bisect_baseline_is_bundled_only_when_it_was_replayed(tmp_path):
    """`bisect --save` bundles the session's stock baseline (tuner.actions.screen.record.bundle_from_bisect): only
    one the bisect replayed bit for bit; otherwise the profile is saved without, and the reason said."""
    from tests.screen.helpers import trajectory
    from tuner.actions.screen.record import bundle_from_bisect
    from tuner.backends.simulated import SimulatedBackend
    from tuner.engine.reference import save_reference

    backend = SimulatedBackend(state_path=tmp_path / "sim")
    traj = trajectory(40)
    save_reference(tmp_path / "base.ref", traj)
    bundle_, why = bundle_from_bisect(backend, "sim0", tmp_path / "base.ref", trial_s=10.0)
    assert bundle_ is None and "not replayed" in why
    traj.repeatable, traj.replayed_steps = True, 40
    save_reference(tmp_path / "base.ref", traj)
    bundle_, why = bundle_from_bisect(backend, "sim0", tmp_path / "base.ref", trial_s=10.0)
    assert bundle_ is not None and bundle_.steps == 40 and bundle_.recording.tier == "bisect baseline"
    rb.write_beside(bundle_, tmp_path / "p.toml")
    assert rb.read_bundle(tmp_path / "p.ref") == bundle_
    none, why = bundle_from_bisect(backend, "sim0", tmp_path / "gone.ref", trial_s=10.0)
    assert none is None and "no such file" in why


def test_a_saved_bisect_profile_carries_its_baseline_beside_it(tmp_path):
    """The one place the CLI's `bisect --save` and the TUI's save bundle a session's baseline
    (tuner.actions.screen.record.bundle_beside_profile): written beside the profile, its size said; a search with no
    session writes nothing and says why."""
    from tests.screen.helpers import trajectory
    from tuner.actions.screen.record import bundle_beside_profile
    from tuner.backends.simulated import SimulatedBackend
    from tuner.engine.reference import save_reference
    from tuner.tuning.job import CardOutcome
    from tuner.tuning.journal import reference_path

    backend = SimulatedBackend(state_path=tmp_path / "sim")
    traj = trajectory(40)
    traj.repeatable, traj.replayed_steps = True, 40
    baseline = reference_path("sim0", "s1")
    baseline.parent.mkdir(parents=True, exist_ok=True)
    save_reference(baseline, traj)
    profile = save_profile(sim_profile("carried"))
    got = bundle_beside_profile(backend, "sim0", CardOutcome("recommended", 0, "s1", params={"trial_s": 6.0}),
                                profile)
    assert got.path == rb.sidecar_path(profile) and got.size_bytes == got.path.stat().st_size > 0
    carried = rb.read_bundle(got.path)
    assert (carried.steps, carried.recording.load_s, carried.sha256) == (40, 6.0, got.sha256)
    assert got.text() == f" with its stock reference {got.path} ({got.size_bytes / 1024:.1f} KiB)"
    other = save_profile(sim_profile("stopped"))
    none = bundle_beside_profile(backend, "sim0", CardOutcome("stopped", 130, None), other)
    assert none.to_dict() == {"path": None, "why": "no bisect session to take it from"}
    assert not rb.sidecar_path(other).exists()


def test_a_saved_profile_without_a_baseline_keeps_no_reference_left_beside_its_name(tmp_path):
    """A reference left at NAME.ref (by a profile of that name deleted by hand, or by the Profiles screen before it
    removed references with their profiles) is not the new profile's: a save that bundles none said "no stock
    reference bundled" while `apply --verify` and `screen --profile` went on using the stale one."""
    from tests.screen.helpers import bundle
    from tuner.actions.screen.record import bundle_beside_profile
    from tuner.backends.simulated import SimulatedBackend
    from tuner.tuning.job import CardOutcome

    backend = SimulatedBackend(state_path=tmp_path / "sim")
    path = save_profile(sim_profile("again"))
    rb.write_beside(bundle(tmp_path), path)  # the old one's, left behind
    said = bundle_beside_profile(backend, "sim0", CardOutcome("stopped", 130, None), path)
    assert said.path is None
    assert rb.reference_beside(path) is None, "a stale reference stays beside a profile that bundled none"

"""Hostile profiles through the real CLI: each gets exit 2 and one clear line; nothing applied or overwritten.

Handwritten cases cover the issue's list; hypothesis mutates a valid profile and throws raw bytes at the parser.
`HOSTILE` is also printed by `python -m tests.profiles.test_hostile` (for the closing note).
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.profiles.helpers import sim, sim_profile, tuner
from tuner.core import paths
from tuner.profiles import Profile, ProfileError, save_profile


def _valid_text() -> str:
    return sim_profile("hostile", tuning={"lowest_pass": -50, "trials": [
        {"setting": -50, "phase": "coarse", "verdict": "pass"}]}).to_toml()


def _edit(old: str, new: str):
    def make(path):
        text = _valid_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
    return make


def _drop_section(section: str):
    def make(path):
        data = tomllib.loads(_valid_text())
        del data[section]
        path.write_text(tomli_w.dumps(data))
    return make


def _bytes(raw: bytes):
    return lambda path: path.write_bytes(raw)


def _symlink(path):
    real = path.with_name("real-profile.toml")
    real.write_text(_valid_text())
    path.symlink_to(real)


HOSTILE = {  # case -> writer of the file at `path`
    "missing [setting]": _drop_section("setting"),
    "missing [device]": _drop_section("device"),
    "wrong type: value = \"abc\"": _edit("value = -45", 'value = "abc"'),
    "wrong type: value = -45.5": _edit("value = -45", "value = -45.5"),
    "wrong type: device = \"x\"": lambda path: path.write_text(tomli_w.dumps({**tomllib.loads(_valid_text()),
                                                                             "device": "x"})),
    "unknown section": _edit('[device]\nvendor = "simulated"', '[extra]\nvendor = "simulated"'),
    "NaN power": _edit("lowest_pass = -50", "lowest_pass = -50\nbaseline_power_w = nan"),
    "inf throughput": _edit("lowest_pass = -50", "lowest_pass = -50\ntuned_tok_s = inf"),
    "huge number": _edit("value = -45", "value = -99999999999999999999999999999"),
    "+300 mV offset": _edit("value = -45", "value = 300"),
    "unknown key": _edit("value = -45", "value = -45\nvoltage_boost = 5"),
    "unknown schema (2)": _edit("schema = 1", "schema = 2"),
    "schema as a string": _edit("schema = 1", 'schema = "1"'),
    "binary garbage": _bytes(bytes(range(256)) * 8),
    "not UTF-8": _bytes(b"[profile]\nname = \"\xff\xfe\"\n"),
    "TOML syntax error": _bytes(b"[profile\nname = "),
    "empty file": _bytes(b""),
    "10 MB file": _bytes(b"# padding\n" * (1024 * 1024)),
    "deeply nested arrays": _bytes(b"a = " + b"[" * 10000 + b"]" * 10000),
    "symlink": _symlink,
}


@pytest.fixture
def keeper():
    """A stored profile named like the hostile one: importing must never replace it."""
    path = save_profile(sim_profile("hostile", value=-10))
    return path, path.read_bytes()


def _store_files():
    return sorted(p.name for d in (paths.user_profiles_dir(), paths.system_profiles_dir()) if d.exists()
                  for p in d.iterdir())


def _assert_one_clean_line(code, out, err):
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith("tuner: error: "), err
    assert "Traceback" not in err + out


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_file_import(capsys, tmp_path, keeper, case):
    bad = tmp_path / "bad.toml"
    HOSTILE[case](bad)
    before = _store_files()
    code, out, err = tuner(capsys, "profile", "import", str(bad), "--overwrite", "--name", "hostile")
    _assert_one_clean_line(code, out, err)
    assert str(bad) in err  # the line names the file
    assert keeper[0].read_bytes() == keeper[1] and _store_files() == before


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_file_apply(capsys, tmp_path, case):
    bad = tmp_path / "bad.toml"
    HOSTILE[case](bad)
    sim().apply("sim0", -5)
    code, out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", str(bad), "--yes", "--force")
    _assert_one_clean_line(code, out, err)
    assert sim().knob("sim0").current == -5 and sim().knob("sim1").current == 0


BAD_NAMES = ["../x", "../../etc/passwd", "a/b", "..", ".hidden", "x" * 200]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_names_with_dot_dot_and_separators(capsys, tmp_path, keeper, name):
    good = tmp_path / "good.toml"
    good.write_text(_valid_text())
    before = _store_files()
    for argv in (["profile", "import", str(good), "--name", name], ["profile", "show", name],
                 ["profile", "delete", name], ["profile", "export", name, str(tmp_path / "out.toml")]):
        code, out, err = tuner(capsys, *argv)
        _assert_one_clean_line(code, out, err)
        assert "bad profile name" in err
    assert _store_files() == before and not (tmp_path / "out.toml").exists()


def test_apply_by_name_through_a_symlink_in_the_store(capsys, tmp_path):
    real = tmp_path / "real.toml"
    real.write_text(sim_profile("linked", value=-60).to_toml())
    paths.user_profiles_dir().mkdir(parents=True)
    (paths.user_profiles_dir() / "linked.toml").symlink_to(real)
    code, out, err = tuner(capsys, "--simulate", "apply", "linked", "--yes")
    _assert_one_clean_line(code, out, err)
    assert "symbolic link" in err and sim().knob("sim0").current == 0


def test_export_never_overwrites(capsys, tmp_path):
    save_profile(sim_profile("mine"))
    target = tmp_path / "exists.toml"
    target.write_text("precious")
    code, out, err = tuner(capsys, "profile", "export", "mine", str(target))
    _assert_one_clean_line(code, out, err)
    assert target.read_text() == "precious"


# --- generated ---------------------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.text(max_size=300), st.integers(), st.integers(min_value=-10**40, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=8), SCALARS, max_size=3))


@st.composite
def mutated_profiles(draw):
    data = tomllib.loads(_valid_text())
    section = draw(st.sampled_from(["profile", "device", "setting", "tuning", "new_section"]))
    table = data.setdefault(section, {})
    op = draw(st.sampled_from(["replace", "delete", "add"]))
    keys = sorted(table)
    if op == "delete" and keys:
        del table[draw(st.sampled_from(keys))]
    elif op == "replace" and keys:
        table[draw(st.sampled_from(keys))] = draw(VALUES)
    else:
        table[draw(st.text(min_size=1, max_size=12))] = draw(VALUES)
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=mutated_profiles())
def test_generated_mutations_are_refused_cleanly_or_stored_exactly(capsys, tmp_path, doc):
    path = tmp_path / "gen.toml"
    path.write_text(tomli_w.dumps(doc))
    store_file = paths.user_profiles_dir() / "gen.toml"
    if store_file.exists():
        store_file.unlink()
    code, out, err = tuner(capsys, "profile", "import", str(path), "--name", "gen")
    if code == 0:  # a harmless mutation (another vbios string, say): what was stored reads back the same
        assert Profile.from_toml(store_file.read_text()).to_dict() == \
            Profile.from_toml(path.read_text()).renamed("gen").to_dict()
    else:
        _assert_one_clean_line(code, out, err)
        assert not store_file.exists()


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=2048) | st.text(max_size=2048).map(str.encode))
def test_random_bytes_only_ever_raise_profile_error(raw):
    try:
        Profile.from_bytes(raw)
    except ProfileError as e:
        assert "\n" not in e.one_line()


def main() -> None:  # pragma: no cover - prints each case's line for the closing note
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "c"), "XDG_STATE_HOME": str(tmp / "s"),
               "TUNER_SYSTEM_PROFILES": str(tmp / "etc")}
        os.environ.update(env)
        for i, (case, make) in enumerate(HOSTILE.items()):
            bad = tmp / f"case{i}.toml"
            make(bad)
            proc = subprocess.run([sys.executable, "-m", "tuner", "--simulate", "apply", str(bad), "--yes"],
                                  capture_output=True, text=True, env=env, check=False)
            print(f"{case}: exit {proc.returncode}: {proc.stderr.strip()}")
        good = tmp / "good.toml"
        good.write_text(_valid_text())
        for name in BAD_NAMES[:3]:
            proc = subprocess.run([sys.executable, "-m", "tuner", "profile", "import", str(good),
                                   "--name", name], capture_output=True, text=True, env=env, check=False)
            print(f"import --name {name}: exit {proc.returncode}: {proc.stderr.strip()}")


if __name__ == "__main__":
    main()

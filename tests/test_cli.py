import json

import pytest

from tests.cli_helpers import run_tuner


def test_list_json_is_one_document():
    proc = run_tuner("--simulate", "--sim-gpus", "2", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["simulated"] is True
    assert [d["id"] for d in doc["devices"]] == ["sim0", "sim1"]
    assert doc["devices"][0]["knob"] == {
        "kind": "voltage_offset", "unit": "mV", "stock": 0, "current": 0, "min": -200, "max": 0, "step": 5,
        "aggressive_direction": -1, "lock_clock_mhz": None, "range_source": "driver",
    }


def test_global_options_work_after_the_command_too():
    proc = run_tuner("list", "--simulate", "--sim-gpus", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("[SIMULATED]") == 3


def test_status_json_has_telemetry_and_knob():
    proc = run_tuner("--simulate", "status", "--device", "sim0", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["device"]["simulated"] is True
    assert set(doc["telemetry"]) >= {"power_w", "temp_edge_c", "temp_hotspot_c", "temp_mem_c", "core_clock_mhz",
                                     "mem_clock_mhz", "voltage_mv", "util_pct", "fan_rpm", "energy_j"}


def test_state_persists_between_invocations_and_reset_restores(monkeypatch):
    from tuner.backends.simulated import SimulatedBackend

    SimulatedBackend().apply("sim0", -35)  # same XDG_STATE_HOME as the subprocesses below
    assert json.loads(run_tuner("--simulate", "status", "--device", "sim0", "--json").stdout)["knob"]["current"] == -35
    proc = run_tuner("--simulate", "reset")
    assert proc.returncode == 0 and "reset to stock" in proc.stdout
    assert json.loads(run_tuner("--simulate", "status", "--device", "sim0", "--json").stdout)["knob"]["current"] == 0


@pytest.mark.parametrize("args, fragment", [
    (["--simulate", "--sim-gpus", "0", "list"], "--sim-gpus must be 1..16"),
    (["--simulate", "--sim-gpus", "two", "list"], "expected a whole number"),
    (["--simulate", "status", "--device", "sim9"], "no device 'sim9'"),
    (["--simulate", "--sim-vmin", "-500", "list"], "--sim-vmin must be between"),
    (["--simulate", "frobnicate"], "invalid choice"),
    # an empty id (`--device "$DEV"` with DEV unset) is not "no --device": it acted on the only card, or all of them
    (["--simulate", "set", "--device", "", "--offset", "-10", "--yes"], "no device ''"),
    (["--simulate", "--sim-gpus", "2", "reset", "--device", ""], "no device ''"),
    (["--simulate", "status", "--device", "", "--json"], "no device ''"),
    (["--simulate", "unsafe", "list", "--device", ""], "no device ''"),
    (["--simulate", "unsafe", "clear", "--device", "", "--yes"], "no device ''"),
    (["--simulate", "stress", "--device", "", "--steps", "1"], "no device ''"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    proc = run_tuner(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error:") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreadable_state_file_exit_2_and_untouched(tmp_path):
    card = tmp_path / "state" / "tuner-simulated" / "seed-0" / "sim0.json"
    card.mkdir(parents=True)
    proc = run_tuner("--simulate", "list", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert proc.returncode == 0 and "cannot read simulated card file" in proc.stdout  # its row says why
    proc = run_tuner("--simulate", "set", "--offset", "-30", "--yes", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert proc.returncode == 2 and "cannot read simulated card file" in proc.stderr, proc.stderr
    assert card.is_dir()


def test_corrupt_state_file_is_reported_and_reset(tmp_path):
    card = tmp_path / "tuner-simulated" / "seed-0" / "sim0.json"
    card.parent.mkdir(parents=True)
    card.write_text('{"offset_mv": "lots"}')
    proc = run_tuner("--simulate", "list", env={"XDG_STATE_HOME": str(tmp_path)})
    assert proc.returncode == 0
    assert "corrupt" in proc.stderr and "Traceback" not in proc.stderr
    assert run_tuner("--simulate", "reset", env={"XDG_STATE_HOME": str(tmp_path)}).returncode == 0
    assert json.loads(card.read_text()) == {}


def test_no_gpu_without_simulate_suggests_it(tmp_path):
    proc = run_tuner("list", env={"TUNER_SYSFS_ROOT": str(tmp_path)})
    if proc.returncode == 0:
        pytest.skip("this machine has a real NVIDIA GPU visible through NVML")
    assert proc.returncode == 4
    assert "no supported GPU found" in proc.stderr and "--simulate" in proc.stderr


def test_version_and_help_document_exit_codes():
    assert run_tuner("--version").stdout.startswith("tuner ")
    help_text = run_tuner("--help").stdout
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "130"):
        assert f"  {code}" in help_text
    assert "XDG_STATE_HOME" in help_text and "TUNER_SYSFS_ROOT" in help_text


def test_help_names_where_the_simulated_cards_live(tmp_path, monkeypatch):
    """`tuner --help` said the simulated cards are in $XDG_STATE_HOME/tuner; they are beside it, in
    $XDG_STATE_HOME/tuner-simulated (tuner.core.paths.simulated_dir, and the README's Files section)."""
    from tuner.core import paths

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert paths.simulated_dir() == tmp_path / "tuner-simulated"
    help_text = " ".join(run_tuner("--help").stdout.split())
    assert "simulated cards in $XDG_STATE_HOME/tuner-simulated" in help_text, help_text


def test_xdg_state_home_is_honoured(tmp_path):
    run_tuner("--simulate", "list", env={"XDG_STATE_HOME": str(tmp_path)})
    from tuner.backends.simulated import SimulatedBackend

    b = SimulatedBackend(state_path=tmp_path / "tuner-simulated" / "seed-0")
    b.apply("sim0", -20)
    status = run_tuner("--simulate", "status", "--json", env={"XDG_STATE_HOME": str(tmp_path)})
    assert json.loads(status.stdout)["devices"][0]["knob"]["current"] == -20


def test_list_shows_every_card_even_when_one_has_overdrive_off(tmp_path):
    from tests.backends.fakes.trees import make_tree

    make_tree(tmp_path, ["rdna4", "rdna3"])
    (tmp_path / "sys/devices/pci0000:00/0000:11:00.0/pp_od_clk_voltage").unlink()  # rdna3 card: overdrive off
    proc = run_tuner("list", "--json", env={"TUNER_SYSFS_ROOT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    devices = {d["id"]: d for d in json.loads(proc.stdout)["devices"]}
    assert devices["0000:10:00.0"]["knob"]["min"] == -200
    assert devices["0000:11:00.0"]["knob"] is None and "ppfeaturemask" in devices["0000:11:00.0"]["error"]
    table = run_tuner("list", env={"TUNER_SYSFS_ROOT": str(tmp_path)}).stdout
    assert "unsupported" in table and "-200..+0 mV" in table


def test_status_shows_every_card_even_when_one_has_overdrive_off(tmp_path):
    """As `tuner list`: one card with Overdrive off must not hide the others. Before, `tuner status` (every card)
    stopped at that card's knob: exit 4 and no line, not even the working card's telemetry."""
    from tests.backends.fakes.trees import make_tree

    make_tree(tmp_path, ["rdna4", "rdna3"])
    (tmp_path / "sys/devices/pci0000:00/0000:11:00.0/pp_od_clk_voltage").unlink()  # rdna3 card: overdrive off
    env = {"TUNER_SYSFS_ROOT": str(tmp_path)}
    proc = run_tuner("status", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    devices = {d["device"]["id"]: d for d in json.loads(proc.stdout)["devices"]}
    assert devices["0000:10:00.0"]["knob"]["min"] == -200 and devices["0000:10:00.0"]["telemetry"]
    assert devices["0000:11:00.0"]["knob"] is None and "ppfeaturemask" in devices["0000:11:00.0"]["error"]
    text = run_tuner("status", env=env)
    assert text.returncode == 0 and "unsupported" in text.stdout and "-200..+0" in text.stdout, text.stderr
    one = run_tuner("status", "--device", "0000:11:00.0", env=env)  # the card asked for: its error is the answer
    assert one.returncode == 4 and "ppfeaturemask" in one.stderr, one.stderr


@pytest.mark.parametrize("option", [["--sim-vmin", "-50"], ["--sim-gpus", "2"], ["--sim-kind", "nvidia"],
                                    ["--sim-seed", "3"], ["--sim-driver", "999.1"]])
def test_a_simulator_option_without_simulate_is_refused(tmp_path, option):
    """`tuner --sim-vmin -52 set ...` (the README's demo with --simulate forgotten) must not quietly act on the real
    cards: --sim-nondeterministic, --sim-contention-after, --sim-sdc-rate and --sim-driver were refused without
    --simulate, --sim-vmin, --sim-gpus, --sim-kind and --sim-seed were ignored and the real card listed, exit 0."""
    from tests.backends.fakes.trees import make_tree

    make_tree(tmp_path, ["rdna4"])
    proc = run_tuner(*option, "list", env={"TUNER_SYSFS_ROOT": str(tmp_path)})
    assert proc.returncode == 2 and "need --simulate" in proc.stderr, (proc.returncode, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and option[0] in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--simulate", "set", "--device", "sim0", "--offset", "abc"], "expected a whole number"),
    (["--simulate", "set", "--device", "sim0", "--offset", "-5", "--keep-timeout", "0"], "expected 1..600 seconds"),
    (["--simulate", "stress", "--device", "sim0", "--steps", "0"], "expected at least 1"),
    (["--simulate", "bisect", "--device", "sim0", "--trial", "5 minutes"], "bad duration"),
    (["--simulate", "apply", "x", "--verify", "soon"], "bad duration"),
    # as every whole number: ASCII digits, at most 18 (int() took both, and the engine died on the first after a
    # start: "internal error: ValueError: Overflow when unpacking long long"; the second recorded with seed 3)
    (["--simulate", "reference", "record", "--seed", "99999999999999999999999", "--duration", "2s", "--out",
      "/proc/x.ref"], "expected a whole number"),
    (["--simulate", "reference", "record", "--seed", "\u0663", "--duration", "2s", "--out", "/proc/x.ref"],
     "expected a whole number"),
])
def test_bad_option_values_are_one_line_and_exit_2(args, fragment):
    proc = run_tuner(*args)
    assert proc.returncode == 2 and fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr


def test_a_command_imports_only_its_own_module(tmp_path):
    """`tuner status` does not import the other commands (the bisect's tuning job, the doctor's checks): measured
    0.56-0.71 s user before, 0.20-0.24 s after. `tuner --help` still lists every command."""
    import subprocess
    import sys

    from tests.cli_helpers import REPO

    probe = ("import sys\nfrom tuner import cli\ncode = cli.main(['--simulate', 'status'])\n"
             "print(sorted(m for m in sys.modules if m.startswith('tuner.commands.') and not m.startswith("
             "'tuner.commands._')), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "['tuner.commands.status']"
    helped = subprocess.run([sys.executable, "-m", "tuner", "--help"], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert all(f"    {name}" in helped.stdout for name in ("list", "bisect", "screen", "doctor", "unsafe"))


def test_a_name_or_sign_the_terminal_cannot_encode_is_escaped_not_a_traceback(tmp_path, boot):
    """Python's stdout is strict in a UTF-8 locale other than C.UTF-8 (en_US.UTF-8: PYTHONIOENCODING=utf-8 here),
    so a file name with a non-UTF-8 byte (a Latin-1 name: Python holds it as a lone surrogate) could not be printed:
    `tuner report` wrote the file, then ended in `UnicodeEncodeError: ... surrogates not allowed`, exit 1. With an
    ASCII stdout `tuner status` died on its first `°C`. Such characters are escaped, as Python's stderr does."""
    from tuner.backends.simulated import SimulatedBackend
    from tuner.tuning import journal

    journal.Journal.create("sim0", params={}, knob={}, backend=SimulatedBackend(state_path=tmp_path / "sim"))
    latin1 = str(tmp_path / "r\udce9sum\u00e9.csv")  # b"r\xe9sum\xc3\xa9.csv" on disk
    proc = run_tuner("--simulate", "report", latin1, env={"PYTHONIOENCODING": "utf-8"})
    assert proc.returncode == 0 and "r\\udce9sumé.csv" in proc.stdout, (proc.returncode, proc.stderr)
    proc = run_tuner("--simulate", "status", env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and "\\xb0C" in proc.stdout, (proc.returncode, proc.stderr)

"""Data-parallel ranks (tuner/engine/distributed.py): real engines, two gloo ranks on the CPU, the tiny preset.

Real processes, real gloo: a peer that dies really closes its sockets, a stalled group really times out. Each run
is a few seconds; the recording is shared by the tests of this module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.conftest import validate_stream
from tuner.engine.options import EngineOptions, UsageProblem, parse_args, to_argv

ROOT = Path(__file__).resolve().parents[2]


def _launch(tmp: Path, name: str, rank: int, *args: str, world: int = 2, timeout_s: float = 10.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "tuner.engine", f"--world-size={world}", f"--rank={rank}",
            f"--rendezvous=file://{tmp / (name + '.rdv')}", f"--collective-timeout-s={timeout_s}", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _events(proc: subprocess.Popen, timeout: float = 120) -> list[dict]:
    out, _ = proc.communicate(timeout=timeout)
    return validate_stream(out.splitlines())


def _group(tmp: Path, name: str, per_rank: list[list[str]], *common: str) -> list[list[dict]]:
    procs = [_launch(tmp, name, r, *common, *extra) for r, extra in enumerate(per_rank)]
    return [_events(p) for p in procs]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    refs = [tmp / "rank0.json", tmp / "rank1.json"]
    runs = _group(tmp, "record", [[f"--record={refs[0]}"], [f"--record={refs[1]}"]], "--steps=12")
    return tmp, refs, runs


def test_all_reduce_keeps_every_rank_on_the_same_weights(recorded):
    _, refs, runs = recorded
    ends = [r[-1] for r in runs]
    assert [e["verdict"] for e in ends] == ["pass", "pass"], ends
    assert [e["data_parallel"]["rank"] for e in ends] == [0, 1]
    assert {e["data_parallel"]["library"] for e in ends} == {"gloo"}
    digests = [json.loads(p.read_text())["digests"] for p in refs]
    # each rank trains on its own windows (its losses differ), the averaged gradients keep the weights equal:
    # the training state after every step is the same bits on both ranks
    assert [d[:8] for d in digests[0]] != [d[:8] for d in digests[1]]
    assert [d[16:32] for d in digests[0]] == [d[16:32] for d in digests[1]]
    assert [d[32:] for d in digests[0]] != [d[32:] for d in digests[1]]  # their own gradients differ
    assert ends[0]["eval_losses"] == ends[1]["eval_losses"]


def test_a_replay_at_stock_is_bitwise_equal_on_every_rank(recorded):
    tmp, refs, _ = recorded
    runs = _group(tmp, "replay", [[f"--reference={refs[0]}"], [f"--reference={refs[1]}"]], "--steps=12")
    for events in runs:
        end = events[-1]
        assert end["verdict"] == "pass", end
        assert end["reference"]["compared_steps"] == 12


def test_a_fault_on_one_rank_shows_in_its_own_figures_and_only_in_the_shared_state_on_the_other(recorded):
    tmp, refs, _ = recorded
    runs = _group(tmp, "fault", [[f"--reference={refs[0]}"],
                                 [f"--reference={refs[1]}", "--inject=bitflip@6:weight:20"]], "--steps=12")
    end0, end1 = runs[0][-1], runs[1][-1]
    assert end1["verdict"] == "fail" and end1["step"] == 6 and end1["figure"] in ("loss", "grad_norm", "grads"), end1
    # rank 0 received the corrupted average: its own loss and gradient norm still match, the state does not (or it
    # lost its peer before comparing); never a fault of its own figures
    assert (end0["verdict"], end0.get("figure")) in (("fail", "state"), ("error", None)), end0
    if end0["verdict"] == "error":
        assert end0["kind"] == "peer"


def test_a_killed_peer_ends_the_other_rank_promptly_as_peer_stalled(tmp_path):
    procs = [_launch(tmp_path, "kill", r, "--duration=120s", timeout_s=300) for r in range(2)]
    try:
        for line in procs[1].stdout:  # wait until rank 1 trains
            if json.loads(line)["event"] == "step":
                break
        os.killpg(procs[1].pid, signal.SIGKILL)
        end = _events(procs[0], timeout=120)[-1]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert (end["verdict"], end["kind"], end["exit_code"]) == ("error", "peer", 2), end
    assert end["reason"].startswith("peer stalled")
    # ended by the dead peer's closed connection, not by waiting out the collective timeout (300 s)
    assert "Timed out" not in end["reason"] and end["steps"] < 120 * 1000


def test_a_group_that_never_forms_is_a_setup_error(tmp_path):
    end = _events(_launch(tmp_path, "alone", 0, "--steps=5", timeout_s=2))[-1]
    assert (end["verdict"], end["kind"]) == ("error", "setup"), end
    assert "did not form" in end["reason"]


def test_the_data_parallel_options_round_trip_through_the_command_line():
    opts = EngineOptions(steps=3, world_size=3, rank=2, rendezvous="tcp://127.0.0.1:29500", collective_timeout_s=7.5)
    argv = to_argv(opts)
    want = {"--world-size=3", "--rank=2", "--rendezvous=tcp://127.0.0.1:29500", "--collective-timeout-s=7.5"}
    assert want <= set(argv)
    assert parse_args(argv, environ={}) == opts


@pytest.mark.parametrize(("argv", "message"), [
    (["--world-size=0"], "--world-size must be at least 1"),
    (["--world-size=2", "--rank=2", "--rendezvous=file:///tmp/x"], "--rank must be in 0..1"),
    (["--world-size=2"], "--world-size 2 needs --rendezvous"),
    (["--rendezvous=file:///tmp/x"], "--rendezvous needs --world-size 2 or more"),
    (["--world-size=2", "--rendezvous=127.0.0.1:29500"], "bad --rendezvous '127.0.0.1:29500'"),
    (["--world-size=2", "--rendezvous=tcp://host:99999"], "bad --rendezvous"),
    (["--world-size=2", "--rendezvous=file:///tmp/x", "--collective-timeout-s=0"],
     "--collective-timeout-s must be positive"),
])
def test_bad_data_parallel_options_get_one_clear_line(argv, message):
    with pytest.raises(UsageProblem) as e:
        parse_args(["--steps=1", *argv], environ={})
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_a_bad_option_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tuner.engine", "--steps=1", "--world-size=2"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    line = ("tuner.engine: error: --world-size 2 needs --rendezvous file:///PATH or tcp://HOST:PORT (the same for "
            "every rank)")
    assert proc.stderr.strip().splitlines() == [line]

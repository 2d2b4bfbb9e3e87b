"""The examples/ run against the simulated card on this machine: the Slurm health check and the Kubernetes Job's
script with the scheduler's environment set by hand (a fake scontrol and kubectl record what they were asked), the
Ansible playbook with ansible-playbook when it is installed (`pip install ansible-core`). The scripts' tests of a
passing node run `tuner` with its screen's engine runs faked (tests/screen/faked_engine_tuner.py): what is tested is
what a script does with the verdict; the real engine's pass screen is test_screen_cli.py's
test_pass_on_another_machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.screen.helpers import LOAD, state
from tests.screen.test_screen_cli import SCHEMA

REPO = Path(__file__).resolve().parents[2]
TUNER = f"{sys.executable} -m tuner"
FAKED = f"{sys.executable} {REPO / 'tests/screen/faked_engine_tuner.py'}"  # engine runs faked: they pass


def fake_tool(tmp_path: Path, name: str) -> tuple[Path, Path]:
    log = tmp_path / f"{name}.log"
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    tool.chmod(0o755)
    return tool, log


def run_script(script: str, env: dict, timeout: float = 300, tuner: str = TUNER) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "TUNER": tuner, **env}
    return subprocess.run([str(REPO / script)], capture_output=True, text=True, env=full, timeout=timeout, cwd=REPO)


def slurm_env(tmp_path, reference, sim_args: str = "") -> tuple[dict, Path]:
    scontrol, log = fake_tool(tmp_path, "scontrol")
    env = {**state(tmp_path, "node17"), "SLURMD_NODENAME": "node17", "TUNER_REFERENCE": str(reference),
           "TUNER_GLOBAL_ARGS": f"--simulate --sim-seed 1 {sim_args}", "TUNER_SCREEN_ARGS": " ".join(LOAD),
           "TUNER_VERDICT_DIR": str(tmp_path / "verdicts"), "SCONTROL": str(scontrol)}
    return env, log


def test_slurm_health_check_keeps_a_good_node(tmp_path, reference):
    env, log = slurm_env(tmp_path, reference)
    r = run_script("examples/slurm/tuner-healthcheck.sh", env, tuner=FAKED)
    assert r.returncode == 0, r.stderr
    assert not log.exists()
    jsonschema.validate(json.loads((tmp_path / "verdicts/screen-node17.json").read_text()), SCHEMA)


def test_slurm_health_check_drains_a_node_that_does_not_pass(tmp_path, reference):
    """Any verdict but pass drains; an incomparable card (another driver) takes that path without an engine run
    (a failing card's verdict and exit code are test_screen_cli.py::test_a_bad_card_fails_persistent_at_stock)."""
    env, log = slurm_env(tmp_path, reference, "--sim-driver 999.1")
    r = run_script("examples/slurm/tuner-healthcheck.sh", env)
    assert r.returncode == 11
    call = log.read_text()
    assert ("update NodeName=node17 State=DRAIN Reason=tuner screen: 1 card: 1 incomparable; sim0 incomparable "
            "(retest): card.driver_version") in call, call


def test_slurm_prolog_drains_by_its_exit_code(tmp_path, reference):
    env, log = slurm_env(tmp_path, reference, "--sim-driver 999.1")
    r = run_script("examples/slurm/tuner-healthcheck.sh", {**env, "SLURM_JOB_ID": "42",
                                                            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    assert r.returncode == 11
    assert not log.exists()  # a prolog's non-zero exit is what drains the node
    assert "incomparable" in r.stderr and "card.driver_version" in r.stderr


def k8s_env(tmp_path, reference, sim_args: str = "") -> tuple[dict, Path]:
    kubectl, log = fake_tool(tmp_path, "kubectl")
    (tmp_path / "results").mkdir()
    env = {**state(tmp_path, "pod"), "NODE_NAME": "gpu-node-01", "TUNER_REFERENCE": str(reference),
           "TUNER_GLOBAL_ARGS": f"--simulate --sim-seed 1 {sim_args}", "TUNER_SCREEN_ARGS": " ".join(LOAD),
           "TUNER_RESULTS": str(tmp_path / "results"), "TUNER_CORDON": "1", "KUBECTL": str(kubectl)}
    return env, log


def test_kubernetes_job_script(tmp_path, reference):
    env, log = k8s_env(tmp_path, reference)
    r = run_script("examples/kubernetes/screen.sh", env, tuner=FAKED)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert json.loads((tmp_path / "results/gpu-node-01.json").read_text()) == doc
    assert not log.exists()


def test_kubernetes_job_script_cordons_a_node_that_does_not_pass(tmp_path, reference):
    env, log = k8s_env(tmp_path, reference, "--sim-driver 999.1")  # no engine run: see the Slurm test above
    r = run_script("examples/kubernetes/screen.sh", env)
    assert r.returncode == 11
    assert json.loads(r.stdout)["verdicts"][0]["verdict"] == "incomparable"
    assert log.read_text().strip() == "cordon gpu-node-01"


def test_kubernetes_manifest_reads_the_exit_codes():
    text = (REPO / "examples/kubernetes/tuner-screen-job.yaml").read_text()
    assert "values: [1, 11]" in text and "values: [10]" in text and "screen.sh" in text


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook is not installed")
def test_ansible_playbook_collects_the_verdicts(tmp_path, reference):
    collect = tmp_path / "collected"
    collect.mkdir()
    extra = {"target": "localhost", "reference": str(reference), "reference_dest": str(tmp_path / "fleet.ref"),
             "tuner": TUNER, "tuner_global_args": "--simulate --sim-seed 1", "tuner_screen_args": " ".join(LOAD),
             "collect_dir": str(collect), "ansible_python_interpreter": sys.executable}
    env = {**os.environ, **state(tmp_path, "host"), "PYTHONPATH": str(REPO), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
    r = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
                        str(REPO / "examples/ansible/tuner-screen.yml")], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:]
    doc = json.loads((collect / "localhost.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == 0 and "1 card: 1 pass" in r.stdout

"""A ``clearformer train`` process killed with SIGKILL -- between steps, or in the middle of
writing a checkpoint -- resumes when the same command runs again, and ends with the same
final weights (bitwise) and the same metrics log as a run that was never interrupted; the
previous checkpoint stays loadable throughout."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from clearformer.train import checkpoint as ckpt

from .train_helpers import env, final_weights, run_train, same_weights, tiny_flags

FLAGS = tiny_flags(steps=60)

# The CLI with every step slowed a little, so that a kill lands in the middle of the run.
SLOW_STEPS = """
import sys, time
from clearformer.train import loop
step = loop.train_step
def slow(*args, **kwargs):
    time.sleep(0.05)
    return step(*args, **kwargs)
loop.train_step = slow
from clearformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("whole") / "run"
    result = run_train(*FLAGS, "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    return run


def assert_same_run(a, b):
    assert same_weights(final_weights(a), final_weights(b))
    assert (a / "metrics.jsonl").read_text() == (b / "metrics.jsonl").read_text()


def test_sigkill_between_steps_then_resume(tmp_path, uninterrupted):
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_STEPS, "train", *FLAGS, "--out", str(run)],
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in process.stderr:
            if line.startswith("step") and int(line.split()[1].split("/")[0]) >= 25:
                break
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGKILL
    assert not (run / "model.safetensors").exists()  # it really died part-way
    newest = ckpt.complete_checkpoints(run / "checkpoints")[0]
    ckpt.load_checkpoint(newest)  # what the kill left loads
    result = run_train(*FLAGS, "--out", str(run))
    assert result.returncode == 0, result.stderr
    assert f"resuming from {newest.name}" in result.stderr
    assert_same_run(uninterrupted, run)


@pytest.mark.parametrize("stage", ["weights", "marker", "rename"])
def test_kill_during_a_checkpoint_write_then_resume(tmp_path, uninterrupted, stage):
    run = tmp_path / "run"
    fault = {ckpt.FAULT_ENV: f"{stage}@30"}
    died = run_train(*FLAGS, "--out", str(run), "-q", **fault)
    assert died.returncode == 17, died.stderr  # the writer's os._exit, mid-write
    folder = run / "checkpoints"
    newest = ckpt.complete_checkpoints(folder)[0]
    expected = "step-00000030" if stage == "rename" else "step-00000020"
    assert newest.name == expected
    # latest names a complete checkpoint, and the previous one loads
    assert (folder / ckpt.read_pointer(folder, "latest") / ckpt.MARKER).is_file()
    ckpt.load_checkpoint(folder / "step-00000020")
    result = run_train(*FLAGS, "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    assert f"resuming from {expected}" in result.stderr
    assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]
    assert_same_run(uninterrupted, run)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_with_a_checkpoint(tmp_path, uninterrupted, signum):
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_STEPS, "train", *FLAGS, "--out", str(run)],
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in process.stderr:
            if line.startswith("step") and int(line.split()[1].split("/")[0]) >= 25:
                break
        process.send_signal(signum)
        err = process.stderr.read()
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, err
    stopped = int(err.split("stopped at step ")[1].split()[0].rstrip(";"))
    assert 25 <= stopped < 60
    # the work up to the signal is kept: a checkpoint of that very step, no final weights
    assert ckpt.complete_checkpoints(run / "checkpoints")[0].name == f"step-{stopped:08d}"
    assert not (run / "model.safetensors").exists()
    result = run_train(*FLAGS, "--out", str(run))
    assert result.returncode == 0, result.stderr
    assert f"resuming from step-{stopped:08d}" in result.stderr
    assert_same_run(uninterrupted, run)

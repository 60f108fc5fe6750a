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

# The CLI with the run held before its 26th step until a line comes on its stdin: the test
# stops it there, part-way for certain (a kill or signal that raced a running loop could come
# too late when the machine is busy).
PAUSE_AT = 25  # steps done when the run waits
PAUSED = f"""
import sys
from clearformer.train import loop
step = loop.train_step
def held(*args, **kwargs):
    if kwargs["step"] == {PAUSE_AT}:  # 0-based: the step after the first {PAUSE_AT}
        print("PAUSED", file=sys.stderr, flush=True)
        sys.stdin.readline()
    return step(*args, **kwargs)
loop.train_step = held
from clearformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start_paused(run) -> subprocess.Popen:
    """``clearformer train`` on FLAGS into ``run``, returned once it waits after PAUSE_AT
    steps."""
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSED, "train", *FLAGS, "--out", str(run)],
        env=env(),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []
    for line in process.stderr:
        said.append(line)
        if line.strip() == "PAUSED":
            return process
    process.kill()
    process.wait(timeout=60)
    raise AssertionError("the run ended before it paused:\n" + "".join(said))


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
    process = start_paused(run)
    try:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)  # a hang fails
    finally:
        process.kill()
    assert process.returncode == -signal.SIGKILL
    assert not (run / "model.safetensors").exists()  # it really died part-way
    newest = ckpt.complete_checkpoints(run / "checkpoints")[0]
    assert newest.name == "step-00000020"  # the last checkpoint before step 25
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
    # A kill after a best checkpoint was published and before `best` moved to it: the resume
    # moves it, as the uninterrupted run did (the export and the pruning read it).
    best = ckpt.read_pointer(uninterrupted / "checkpoints", ckpt.BEST)
    assert best is not None and ckpt.read_pointer(folder, ckpt.BEST) == best


def test_a_kill_before_best_moved_to_the_last_checkpoint_is_repaired_by_the_rerun(tmp_path):
    """Killed once the final, best checkpoint is published and before `best` names it, the
    rerun has no step left to take: the resume itself moves `best`."""
    run = tmp_path / "run"
    flags = [*tiny_flags(steps=10, eval_every=10, checkpoint_every=10), "--out", str(run), "-q"]
    died = run_train(*flags, **{ckpt.FAULT_ENV: "rename@10"})
    assert died.returncode == 17, died.stderr
    folder = run / "checkpoints"
    assert ckpt.read_pointer(folder, ckpt.BEST) is None  # the kill came first
    result = run_train(*flags)
    assert result.returncode == 0, result.stderr
    assert ckpt.read_pointer(folder, ckpt.BEST) == "step-00000010"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_with_a_checkpoint(tmp_path, uninterrupted, signum):
    run = tmp_path / "run"
    process = start_paused(run)
    try:
        process.send_signal(signum)
        # The handler has answered before the run goes on: it stops after the next step.
        said = []
        for line in process.stderr:
            said.append(line)
            if "stopping after this step" in line:
                break
        process.stdin.write("go\n")
        process.stdin.close()
        err = "".join(said) + process.stderr.read()
        process.wait(timeout=60)  # a hang fails
    finally:
        process.kill()
    assert process.returncode == 128 + signum, err
    stopped = int(err.split("stopped at step ")[1].split()[0].rstrip(";"))
    assert stopped == PAUSE_AT + 1
    # the work up to the signal is kept: a checkpoint of that very step, no final weights
    assert ckpt.complete_checkpoints(run / "checkpoints")[0].name == f"step-{stopped:08d}"
    assert not (run / "model.safetensors").exists()
    result = run_train(*FLAGS, "--out", str(run))
    assert result.returncode == 0, result.stderr
    assert f"resuming from step-{stopped:08d}" in result.stderr
    assert_same_run(uninterrupted, run)

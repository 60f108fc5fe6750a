"""Data-parallel training under torchrun (gloo on 127.0.0.1): DDP ranks agree with each other
and with one process of the same global batch, and so does FSDP2 with a group per encoder
block (gathered one block at a time) and activation checkpointing; FSDP2 resumes bitwise from
distributed checkpoints, and a checkpoint of 2 processes loads into 1 and into 3 with the same
model and optimizer state; the single-file export loads into a plain model."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from clearformer.train import checkpoint as ckpt
from clearformer.train import train
from clearformer.train.tasks import build_task

from .helpers import torchrun_command
from .train_helpers import TINY, env, final_weights, same_weights, tiny, tiny_flags

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not available"
)

# 48 examples a step split evenly over 1, 2 or 3 processes; two blocks, two FSDP groups.
FSDP = {"distributed": "fsdp", "batch_size": 48, "steps": 30, "dropout": 0.1, "n_layers": 2}

# train() under torchrun, then every rank saves the parameters it holds. Then the same config
# under FSDP2 (checkpointing on), and one forward that notes, as each block starts, which
# blocks hold their full parameters (FSDP2 swaps a group's sharded DTensors for full tensors
# while the group runs).
RANK_WEIGHTS = """
import json, os, sys, torch
from safetensors.torch import save_file
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from clearformer.blocks import EncoderBlock
from clearformer.train import TrainConfig, train
from clearformer.train.tasks import build_task
torch.distributed.init_process_group("gloo")  # one group for both runs: train() then keeps it
config, out = TrainConfig(**json.loads(sys.argv[1])), sys.argv[2]
result = train(config, out)
state = {k: v.detach().contiguous() for k, v in result.model.state_dict().items()}
save_file(state, f"{out}/rank{os.environ['RANK']}.safetensors")

fsdp = TrainConfig(**{**json.loads(sys.argv[1]), "distributed": "fsdp", "checkpointing": True})
result = train(fsdp, out + "-fsdp")
model = result.model
blocks = [m for m in model.modules() if isinstance(m, EncoderBlock)]
seen = []
def note(index):
    def hook(module, args, kwargs):
        seen.append([index, [not isinstance(b.mlp_norm.weight, DTensor) for b in blocks]])
    return hook
for index, block in enumerate(blocks):
    block.register_forward_pre_hook(note(index), with_kwargs=True)  # after FSDP2's own
sharded = [all(isinstance(p, DTensor) for p in b.parameters()) for b in blocks]
with torch.no_grad():
    model(build_task(fsdp).train_batch(list(range(8))))
report = {"groups": [isinstance(b, FSDPModule) for b in blocks], "sharded": sharded, "seen": seen}
with open(f"{out}-fsdp/blocks{os.environ['RANK']}.json", "w") as handle:
    json.dump(report, handle)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""

# Load a run's newest (sharded) checkpoint with this world size; rank 0 saves the full model
# and optimizer state it reassembles.
RESHARD = """
import json, os, sys, torch
from safetensors.torch import save_file
from clearformer.train import TrainConfig, checkpoint as ckpt, distributed
from clearformer.train.step import build_optimizer
from clearformer.train.tasks import build_task
config, run, out = TrainConfig(**json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]
context = distributed.setup("fsdp", torch.device("cpu"))
model = distributed.wrap(build_task(config).build_model(), context, torch.device("cpu"))
optimizer = build_optimizer(model, config)
newest = ckpt.load_newest(__import__("pathlib").Path(run) / "checkpoints")
distributed.load_sharded(newest.path / "dcp", model, optimizer)
weights = distributed.full_state_dict(model, context)
optim = distributed.full_optimizer_state(model, optimizer, context)
if context.is_main:
    save_file({k: v.contiguous() for k, v in weights.items()}, out + ".model.safetensors")
    flat = {f"{name}.{key}": value.contiguous() for name, entry in optim["state"].items()
            for key, value in entry.items() if torch.is_tensor(value) and value.dim() > 0}
    save_file(flat, out + ".optim.safetensors")
context.close()
"""


def torchrun(
    nproc: int, *argv: str, timeout: float = 600, **extra_env: str
) -> subprocess.CompletedProcess:
    command = torchrun_command(nproc, *argv)
    return subprocess.run(
        command,
        env=env(OMP_NUM_THREADS="1", **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tail(result: subprocess.CompletedProcess) -> str:
    """The workers' own lines (torchrun's report of a failure comes after them)."""
    lines = [x for x in result.stderr.splitlines() if not x.startswith("W1")]
    # torchrun's report of a failed worker (its own traceback, 40 lines) would push the
    # workers' last lines (a Python stack printed at an abort, say) out of the tail.
    report = next((i for i, x in enumerate(lines) if "elastic/multiprocessing" in x), len(lines))
    return "\n".join(lines[:report][-80:] + lines[report:][-12:])


def cli(nproc: int, *argv: str, **extra_env: str) -> subprocess.CompletedProcess:
    return torchrun(nproc, "-m", "clearformer.cli", "train", *argv, **extra_env)


def script(
    nproc: int, code: str, tmp_path, *argv: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(code)
    return torchrun(nproc, str(path), *argv, timeout=timeout)


def config_json(**changes) -> str:
    return json.dumps({**TINY, **changes})


def test_ddp_ranks_agree_and_equal_one_process(tmp_path):
    # eps=1e-4: attention's key bias has a true gradient of exactly zero (softmax ignores a
    # shift shared by all keys), so its gradient is rounding noise, which Adam with eps=1e-8
    # divides by its own size into lr-sized steps of random sign; in any two summation orders
    # (one process, two ranks) those steps differ by ~lr. eps=1e-4 keeps noise steps small.
    changes = {"distributed": "ddp", "dropout": 0.0, "steps": 10, "batch_size": 32, "eps": 1e-4}
    changes["n_layers"] = 2
    result = script(2, RANK_WEIGHTS, tmp_path, config_json(**changes), str(tmp_path / "ddp"))
    assert result.returncode == 0, tail(result)
    rank0 = load_file(tmp_path / "ddp" / "rank0.safetensors")
    rank1 = load_file(tmp_path / "ddp" / "rank1.safetensors")
    assert same_weights(rank0, rank1)
    assert same_weights(rank0, final_weights(tmp_path / "ddp"))
    single = train(tiny(**{**changes, "distributed": "none"}), tmp_path / "one")
    one = {k: v.detach() for k, v in single.model.state_dict().items()}
    for name, value in one.items():
        torch.testing.assert_close(rank0[name], value, rtol=0, atol=1e-6, msg=name)
    # the metrics log: the loss over both ranks' halves is the one process's loss
    logged = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    alone = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("loss") for r in logged] == pytest.approx([r.get("loss") for r in alone])

    # FSDP2, a group per block and activation checkpointing: the same model as one process.
    sharded = final_weights(tmp_path / "ddp-fsdp")
    for name, value in one.items():
        torch.testing.assert_close(sharded[name], value, rtol=0, atol=1e-6, msg=name)
    for rank in (0, 1):
        report = json.loads((tmp_path / "ddp-fsdp" / f"blocks{rank}.json").read_text())
        assert report["groups"] == [True, True] and report["sharded"] == [True, True]
        # As block i starts, block i alone holds its full parameters: one group at a time.
        assert report["seen"] == [[0, [True, False]], [1, [False, True]]], report


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("fsdp") / "run"
    result = cli(2, *tiny_flags(**FSDP), "--out", str(run), "-q")
    assert result.returncode == 0, tail(result)
    return run


def test_fsdp_checkpoints_are_sharded_and_the_export_loads_into_a_plain_model(fsdp_run):
    newest = ckpt.complete_checkpoints(fsdp_run / "checkpoints")[0]
    assert (newest / "dcp" / ".metadata").is_file() and not (newest / "model.safetensors").exists()
    assert len(list((newest / "dcp").glob("*.distcp"))) == 2  # one file per rank
    model = build_task(tiny(**FSDP)).build_model()
    model.load_state_dict(final_weights(fsdp_run), strict=True)


def test_fsdp_resume_after_a_kill_is_bitwise(tmp_path, fsdp_run):
    run = tmp_path / "run"
    died = cli(2, *tiny_flags(**FSDP), "--out", str(run), "-q", **{ckpt.FAULT_ENV: "marker@20"})
    assert died.returncode != 0
    assert ckpt.complete_checkpoints(run / "checkpoints")[0].name == "step-00000010"
    result = cli(2, *tiny_flags(**FSDP), "--out", str(run))
    assert result.returncode == 0, tail(result)
    assert "resuming from step-00000010" in result.stderr
    assert same_weights(final_weights(fsdp_run), final_weights(run))
    assert (fsdp_run / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()


@pytest.fixture(scope="module")
def two_process_state(tmp_path_factory, fsdp_run):
    """The model and optimizer state that 2 processes reassemble from the run's newest
    checkpoint: ``PREFIX.model.safetensors`` and ``PREFIX.optim.safetensors``."""
    folder = tmp_path_factory.mktemp("reshard")
    reference = script(2, RESHARD, folder, config_json(**FSDP), str(fsdp_run), str(folder / "two"))
    assert reference.returncode == 0, tail(reference)
    return folder / "two"


@pytest.mark.parametrize("nproc", [1, 3])
def test_a_two_process_checkpoint_resumes_with_another_world_size(
    tmp_path, fsdp_run, two_process_state, nproc
):
    loaded = script(
        nproc, RESHARD, tmp_path, config_json(**FSDP), str(fsdp_run), str(tmp_path / "other")
    )
    assert loaded.returncode == 0, tail(loaded)
    for part in ("model", "optim"):
        a = load_file(f"{two_process_state}.{part}.safetensors")
        b = load_file(tmp_path / f"other.{part}.safetensors")
        assert a and same_weights(a, b), part
    # the step-30 weights are the run's final export
    assert same_weights(
        load_file(f"{two_process_state}.model.safetensors"), final_weights(fsdp_run)
    )
    # and training goes on with nproc processes
    run = tmp_path / "run"
    shutil.copytree(fsdp_run, run)
    more = cli(nproc, *tiny_flags(**{**FSDP, "steps": 40}), "--out", str(run), "-q")
    assert more.returncode == 0, tail(more)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["resumed_from"], summary["steps"]) == (30, 40)


def test_a_world_size_the_batch_cannot_be_split_over_is_refused(tmp_path):
    result = cli(3, *tiny_flags(**{**FSDP, "batch_size": 32}), "--out", str(tmp_path / "r"))
    assert result.returncode != 0
    assert "batch_size=32 cannot be split over 3 processes" in result.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_distributed_none_under_torchrun_is_refused(tmp_path):
    result = cli(2, *tiny_flags(), "--out", str(tmp_path / "r"))
    assert result.returncode != 0
    assert "distributed must be 'ddp' or 'fsdp' under torchrun" in result.stderr


# train() twice in one torchrun process: the second call joins the group the first started
# (torchrun's rendezvous serves one group per process; a re-made one would wait forever).
TWICE = """
import json, sys
from clearformer.train import TrainConfig, train
config = TrainConfig(**json.loads(sys.argv[1]))
train(config, sys.argv[2])
train(config, sys.argv[3])
"""


def test_two_runs_in_one_torchrun_process(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    argv = config_json(distributed="ddp"), str(first), str(second)
    result = script(2, TWICE, tmp_path, *argv, timeout=180)  # a hang fails, not waits
    assert result.returncode == 0, tail(result)
    assert same_weights(final_weights(first), final_weights(second))  # one seed, one model

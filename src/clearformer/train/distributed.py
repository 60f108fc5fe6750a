"""Data-parallel training under ``torchrun``: DDP (replicated parameters) or FSDP2
(``torch.distributed.fsdp.fully_shard``: parameters, gradients and optimizer state sharded).

Every rank builds the same model from the same seed, takes the same global batch from the
sampler and keeps its own slice of it (``shard``): so the global batch, and the data order,
do not depend on the number of processes. Each rank's loss is its summed cross-entropy over
the *global* example count times the world size, and DDP / FSDP average gradients over the
ranks, so the gradient is that of the global batch's mean loss: the same, within float
rounding, as one process with the same global batch.

Launch: ``torchrun --nproc_per_node=2 -m clearformer.cli train --distributed ddp ...``
(gloo on CPU, NCCL on CUDA). ``--distributed ddp|fsdp`` without torchrun runs as a group of
one process, which is how a checkpoint written by N processes is resumed by one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class Context:
    """Where this process stands: its rank, the world size, and the mode."""

    mode: str = "none"  # none | ddp | fsdp
    rank: int = 0
    world: int = 1
    started_group: bool = False
    launched: bool = False  # under torchrun (its rendezvous), not a group of one

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.mode == "fsdp"

    def barrier(self) -> None:
        if self.mode != "none":
            dist.barrier()

    def sum(self, value: float) -> float:
        """A float summed over the ranks (every rank gets the sum)."""
        if self.mode == "none":
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor)
        return tensor.item()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.mode == "none":
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def shard(self, indices: list[int]) -> list[int]:
        """This rank's slice of the global batch (equal slices: see :func:`check_split`)."""
        if self.world == 1:
            return indices
        size = len(indices) // self.world
        return indices[self.rank * size : (self.rank + 1) * size]

    def close(self) -> None:
        if self.started_group and dist.is_initialized():
            # No rank leaves while another still talks to it: gloo aborts a process whose
            # peer closed the connection mid-collective.
            dist.barrier()
            if self.launched:
                # torchrun's rendezvous serves one group per process: destroyed here, it could
                # not be made again by a later train() in the same process (which would wait
                # forever). The group stays, a later call joins it, and it goes at exit.
                _destroy_at_exit()
            else:
                dist.destroy_process_group()


def setup(mode: str, device: torch.device) -> Context:
    """Join (or, without torchrun, start) the process group ``mode`` needs."""
    launched = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if mode == "none":
        if launched and world > 1:
            raise ValueError(
                f"distributed must be 'ddp' or 'fsdp' under torchrun (WORLD_SIZE={world}), "
                "got 'none': each process would train alone and write the same run folder"
            )
        return Context()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        return Context(mode, dist.get_rank(), dist.get_world_size())
    if launched:
        dist.init_process_group(backend)
    else:  # a group of one: resume a multi-process run, or try the mode, without torchrun
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    context = Context(
        mode, dist.get_rank(), dist.get_world_size(), started_group=True, launched=launched
    )
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return context


@functools.cache  # registered once, however many runs keep the group
def _destroy_at_exit() -> None:
    atexit.register(_destroy_if_initialized)


def _destroy_if_initialized() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_split(batch_size: int, accumulation: int, world: int) -> None:
    """Every rank gets an equal slice of the global batch, of at least ``accumulation``
    examples: a rank without an example would have no gradient to average, and would wait
    for the others forever."""
    if world == 1:
        return
    if batch_size % world or batch_size // world < accumulation:
        fits = [n for n in range(2, 65) if batch_size % n == 0 and batch_size // n >= accumulation]
        raise ValueError(
            f"batch_size={batch_size} cannot be split over {world} processes (each needs an "
            f"equal share of at least accumulation={accumulation} examples); this batch_size "
            f"splits over {fits or 'no'} processes"
        )


def wrap(model: nn.Module, context: Context, device: torch.device) -> nn.Module:
    """DDP around the model, or FSDP2 (``fully_shard``) on it."""
    if context.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None
        )
    if context.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from ..blocks import EncoderBlock

        mesh = init_device_mesh(device.type, (context.world,))
        # A group per encoder block, then the root for the rest (embeddings, norms, heads).
        # FSDP2 gathers a group's parameters in its forward pre-hook (the encoder calls its
        # blocks through __call__ for this) and frees them after the group's forward, so the
        # full parameters of one block at a time are held, not the whole model's. Decoder
        # blocks stay in the root's group: the decoder runs them through DecoderBlock.run.
        for block in [m for m in model.modules() if isinstance(m, EncoderBlock)]:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def no_sync(model: nn.Module, context: Context, last: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of a step (DDP)."""
    if context.mode == "ddp" and not last:
        return model.no_sync()
    return contextlib.nullcontext()


def full_state_dict(model: nn.Module, context: Context) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain tensors on CPU (a collective under FSDP: every
    rank must call it; only rank 0 receives them)."""
    if context.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def save_sharded(path: os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Model and optimizer, each rank its shards, to a ``torch.distributed.checkpoint`` folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(path))


def load_sharded(path: os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a ``save_sharded`` folder written by any number of processes (DCP reshards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, context: Context):
    """The optimizer's whole state keyed by parameter name (collective under FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=context.sharded)
    return get_optimizer_state_dict(model, optimizer, options=options)

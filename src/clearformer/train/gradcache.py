"""One contrastive optimizer step, with GradCache when the batch is embedded in mini-batches.

An in-batch negatives loss couples every example of the batch, so the batch cannot be cut into
micro-batches whose losses add up. GradCache (Gao et al., 2021) cuts it anyway, in three passes:

1. embed every text of the batch in mini-batches **without** gradients, keeping the embeddings
   (B x d numbers, not the activations) and each mini-batch's random state;
2. compute the loss on the whole batch of cached embeddings and its gradient with respect to
   each embedding;
3. embed each mini-batch again **with** gradients, from the same random state (so dropout
   draws the same masks and the embeddings are the cached ones), and back-propagate the cached
   embedding gradients through it.

The parameters' gradient is then the full batch's (the chain rule, split at the embeddings),
while memory holds one mini-batch's activations: the batch size is bounded by time, not
memory. The extra cost is one forward pass without gradients.

Under ``torchrun`` each rank embeds its slice of the batch; the cached embeddings of every rank
are gathered so that each anchor sees every rank's candidates (the same negatives as one
process with the whole batch); the loss's gradient is taken for this rank's rows; DDP averages
the ranks' parameter gradients, so each rank's are multiplied by the world size, as in
:func:`.step.train_step`; with GradCache the passes run on the module itself and the
gradients are summed over the ranks after the last mini-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .distributed import Context, unwrap
from .precision import Precision
from .rng import rng_state, set_rng_state

# (anchors (B, d), candidates (C, d)) -> scalar loss
LossFn = Callable[[Tensor, Tensor], Tensor]


def contrastive_step(
    model: nn.Module,
    texts: Sequence[Sequence[int]],
    counts: tuple[int, int, int],
    collate: Callable[[Sequence[Sequence[int]]], object],
    loss_fn: LossFn,
    *,
    mini_batch_size: int,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    scaler: torch.amp.GradScaler | None,
    clip_norm: float,
    device: torch.device,
    context: Context | None = None,
    checkpointing: bool = False,
) -> tuple[float, float]:
    """Forward, backward and update over this rank's texts.

    Args:
        texts: this rank's token-id lists: its b anchors, then its b positives, then its
            negatives.
        counts: (b anchors, b positives, negatives) of ``texts``.
        collate: token-id lists -> a batch the model takes.
        mini_batch_size: texts embedded at a time with GradCache; 0 = all at once, gradients
            straight through (no GradCache).

    Returns:
        (the step's loss, the gradient's global L2 norm before clipping).
    """
    context = context or Context()
    optimizer.zero_grad(set_to_none=True)
    options = {"checkpointing": True} if checkpointing else {}

    def embed(chunk: Sequence[Sequence[int]]) -> Tensor:
        batch = collate(chunk).to(device)
        with precision.autocast():
            return model(batch, **options).float()  # (n, d); the loss in float32

    cached_passes = 0 < mini_batch_size < len(texts)
    if context.world > 1 and mini_batch_size > 0:
        # Rows carry different numbers of negatives, so the ranks' text counts differ; the two
        # paths run different collectives (DDP's own all-reduce against the one after the last
        # mini-batch), so every rank takes GradCache's if any rank needs it.
        cached_passes = _on_any_rank(cached_passes, device)
    if not cached_passes:
        embeddings = embed(texts)  # (n, d) with gradients: the plain step
        loss = _global_loss(embeddings, counts, context, loss_fn)
        _backward(loss * context.world, scaler)
    else:
        # Under DDP the mini-batches run on the module itself, and the gradients are summed
        # over the ranks once, by hand, after the last one: every rank's passes are its own
        # and nothing is all-reduced half-way.
        module = unwrap(model)

        def embed_local(chunk: Sequence[Sequence[int]]) -> Tensor:
            batch = collate(chunk).to(device)
            with precision.autocast():
                return module(batch, **options).float()  # (n, d)

        chunks = [texts[i : i + mini_batch_size] for i in range(0, len(texts), mini_batch_size)]
        states, cached = [], []
        with torch.no_grad():
            for chunk in chunks:  # pass 1: embeddings only, each chunk's random state kept
                states.append(rng_state())
                cached.append(embed_local(chunk))
        after = rng_state()
        embeddings = torch.cat(cached).requires_grad_()  # (n, d)
        loss = _global_loss(embeddings, counts, context, loss_fn)  # pass 2: the loss
        loss.backward()
        grads = embeddings.grad.split([len(c) for c in chunks])
        for chunk, state, grad in zip(chunks, states, grads, strict=True):
            set_rng_state(state)  # the same dropout masks as pass 1
            again = embed_local(chunk)  # pass 3: with gradients, one chunk at a time
            _backward((again * grad).sum(), scaler)  # its gradient is `grad`
        set_rng_state(after)
        if context.world > 1:
            _sum_over_ranks(module)
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else math.inf)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return loss.item(), norm.item()


def _on_any_rank(flag: bool, device: torch.device) -> bool:
    """``flag`` or'ed over the ranks (a collective: every rank calls it)."""
    import torch.distributed as dist

    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _sum_over_ranks(module: nn.Module) -> None:
    """Each parameter's gradient summed over the ranks: each rank's is its rows' share of the
    whole batch's gradient, so the sum is the whole."""
    import torch.distributed as dist

    for parameter in module.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)


def _backward(loss: Tensor, scaler) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def _global_loss(embeddings: Tensor, counts, context: Context, loss_fn: LossFn) -> Tensor:
    """The loss of the whole batch: every rank's anchors against every rank's candidates, with
    the gradient flowing to this rank's rows only (every rank computes the same loss)."""
    b, _, n_neg = counts
    parts = [embeddings]
    if context.world > 1:
        gathered = context.gather(embeddings.detach().cpu())  # every rank's (n_r, d)
        parts = [e.to(embeddings.device) for e in gathered]
        parts[context.rank] = embeddings  # this rank's own rows keep their gradient
        sizes = [len(p) for p in parts]
        bs = [b] * context.world
        negs = [s - 2 * b for s in sizes]
    else:
        bs, negs = [b], [n_neg]
    anchors = torch.cat([p[:k] for p, k in zip(parts, bs, strict=True)])  # (B, d)
    positives = torch.cat([p[k : 2 * k] for p, k in zip(parts, bs, strict=True)])  # (B, d)
    negatives = [p[2 * k : 2 * k + m] for p, k, m in zip(parts, bs, negs, strict=True)]
    candidates = torch.cat([positives, *negatives])  # (B + negatives, d)
    return loss_fn(anchors, candidates)

"""Decoding a :class:`~clearformer.seq2seq.Seq2SeqTransformer`: greedy and beam search, with
an explicit key/value cache.

Each step feeds only the newest token: the cache holds every earlier token's self-attention
keys and values, and the memory's cross-attention keys and values, projected once per source.
A row that has produced the end token stops costing compute: its rows leave the batch (and the
cache). Tokens after the end token are ``pad_id``.

Scores. A sequence's score is ``sum(logprobs) / L ** length_penalty``, where ``logprobs`` are
the log-probabilities of its tokens and ``L`` counts its tokens including the end token
(Hugging Face's definition). ``length_penalty`` > 0 favours longer sequences, < 0 shorter ones.
The returned ``token_logprobs`` rebuild every score.

``early_stopping`` (beam search), by name:

* ``True``: a source is done as soon as ``num_beams`` hypotheses have ended.
* ``False``: done when ``num_beams`` have ended and the best candidate of this step (among
  all ``2 num_beams``, those that just ended included), scored as if it ended now (its sum over
  the tokens so far), cannot beat the worst ended one (the rule of Hugging Face's
  ``BeamSearchScorer`` up to transformers 4; transformers 5 takes the best running beam, and
  differs in rare cases, where this rule keeps the better hypothesis; a later, better
  hypothesis can still be missed).
* ``"never"``: done only when no running beam can beat the worst ended one whatever it does
  next: its sum can only fall, so its best score is its sum over ``max_new_tokens ** lp`` when
  ``lp > 0`` and over the current length otherwise. Exact within the beam.

``min_length``: the end token is forbidden until that many tokens are generated. The padding
id is never generated: its probability is removed and the rest renormalised.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .checks import check_bool, check_int, check_positive_int
from .fast.reordered_weights import ReorderedWeights, use_reordered_weights
from .precision import check_precision
from .routes import routes_fixed_for_call

log = logging.getLogger(__name__)

EARLY_STOPPING = (True, False, "never")
GENERATE_PRECISIONS = ("float32", "bf16", "auto")  # int8 is for embeddings only


@dataclass(frozen=True)
class Generated:
    """Decoded sequences.

    Attributes:
        sequences: (B, L) int64 generated tokens (the start token excluded), ``pad_id`` after
            each row's end token; L = the longest row.
        lengths: (B,) tokens of each row, its end token included.
        scores: (B,) float32 ``sum(token_logprobs) / lengths ** length_penalty``.
        token_logprobs: (B, L) float32 log-probability of each token, 0 after the end.
    """

    sequences: Tensor
    lengths: Tensor
    scores: Tensor
    token_logprobs: Tensor


def generate(
    model,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_new_tokens: int,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    min_length: int = 0,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
    use_cache: bool = True,
    precision: str = "float32",
) -> Generated:
    """Decode each source of ``src`` (B, S) with ``src_mask`` (B, S) (True/1 = real token).

    ``num_beams`` 1 is greedy search. ``use_cache=False`` recomputes every step from the whole
    prefix (the reference the cache is tested against). Ids default to the model's config.
    Decoding runs without dropout: a model in training mode is put in eval mode for the call,
    and each of its modules gets its own mode back after it.
    On a CPU in float32 the call holds a copy of every linear weight in oneDNN's layout
    (:mod:`clearformer.fast.reordered_weights`) until it returns.

    ``precision``: ``"float32"``; ``"bf16"`` (or ``"bfloat16"``): the call runs on a
    bfloat16 copy of ``model`` (:func:`clearformer.precision.bf16_copy`, made per call and
    dropped after it: convert once with ``bf16_copy`` and pass the copy to decode many
    batches; a model already in bfloat16 runs as it is), log-probabilities in float32;
    ``"auto"``: bf16 where :func:`clearformer.precision.choose_precision` takes it (this CPU's
    measured verdict; an NVIDIA GPU from Ampere on), else float32 (the choice and its reason
    are logged at INFO level). bfloat16 logits are close to float32's, not equal: a near tie
    between two tokens can decode differently.
    """
    cfg = model.config
    bos = cfg.bos_id if bos_id is None else bos_id
    eos = cfg.eos_id if eos_id is None else eos_id
    pad = cfg.pad_id if pad_id is None else pad_id
    check_positive_int(max_new_tokens, "max_new_tokens")
    check_positive_int(num_beams, "num_beams")
    check_int(min_length, "min_length", high=max_new_tokens + 1, high_name="max_new_tokens + 1")
    for value, name in ((bos, "bos_id"), (eos, "eos_id"), (pad, "pad_id")):
        check_int(value, name, high=cfg.target_vocab, high_name="the target vocabulary size")
    # By identity: 1, 1.0 and numpy's True equal True (and 0.0 equals False), yet the beam
    # search tests `is True` / `is False`, so they would run as "never".
    if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if (
        not isinstance(length_penalty, (int, float))
        or isinstance(length_penalty, bool)
        or not math.isfinite(length_penalty)
    ):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    # A score divides by length ** length_penalty, a float that must not overflow at the
    # longest hypothesis (10 ** 308).
    bound = 700 / math.log(max(max_new_tokens, 2) + 1)
    if abs(length_penalty) > bound:
        raise ValueError(
            f"length_penalty must be within +-{bound:.0f} for max_new_tokens={max_new_tokens} "
            f"(length ** length_penalty overflows beyond), got {length_penalty!r}"
        )
    check_bool(use_cache, "use_cache")
    precision = check_precision(precision, "precision", GENERATE_PRECISIONS)
    # The start token and every generated token but the last are fed back: max_new_tokens
    # target positions in all.
    if max_new_tokens > cfg.max_positions:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} needs {max_new_tokens} target positions (the "
            f"start token and all but the last new token), above max_positions="
            f"{cfg.max_positions}"
        )
    _check_not_empty(src, src_mask)
    with _without_dropout(model):
        model = _in_precision(model, precision)
        search = _Search(model, bos, eos, pad, max_new_tokens, min_length, float(length_penalty))
        # Every decoding step is a forward pass with few rows, whose fused linear calls would
        # each reorder their weight into oneDNN's layout: reorder each once for the whole call.
        # The linear route (and its walk over the modules for hooks) is decided once for all
        # steps.
        with torch.no_grad(), use_reordered_weights(ReorderedWeights()), routes_fixed_for_call():
            memory = model.encode(src, src_mask)  # (B, S, D), validates src and its mask
            mask = None if src_mask is None else src_mask.bool()
            if mask is not None and bool(mask.all()):
                # No padding: every step's cross-attention runs unmasked (a mask of all True
                # changes nothing but costs each step a masked kernel and its checks).
                mask = None
            if num_beams == 1:
                return search.greedy(memory, mask, use_cache)
            return search.beam(memory, mask, num_beams, early_stopping, use_cache)


@contextlib.contextmanager
def _without_dropout(model):
    """Every module of ``model`` in eval mode for the call, each one's own mode restored after.

    Decoding is inference: a model left in training mode (as a freshly built one is) would
    drop activations at random and decode differently on every call. Each module's mode is
    restored as it was, so a caller's mix (say, a frozen encoder in eval) survives the call.
    """
    if not isinstance(model, torch.nn.Module):
        yield  # a stand-in with encode / decode only: no modes to switch
        return
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _in_precision(model, precision: str):
    """``model`` itself, or its bfloat16 copy where ``precision`` (checked) takes bf16."""
    from .precision import bf16_copy, choose_precision, is_bf16

    if precision == "float32":
        return model  # as it is (a model the caller converted runs in its own dtype)
    device = next(model.parameters()).device
    decision = choose_precision(precision, device=device, offered=("float32", "bf16"))
    log.info("generate in %s (%s)", decision.choice, decision.reason)
    if decision.choice != "bf16" or is_bf16(model):
        return model
    return bf16_copy(model)


def _check_not_empty(src: Tensor, src_mask: Tensor | None) -> None:
    """A source with no real token has nothing to decode from: refused before any work."""
    if not isinstance(src, Tensor) or src.dim() != 2:
        return  # the model's own check names the shape
    if src.shape[1] == 0:
        raise ValueError("src has no tokens (shape (B, 0)): there is nothing to decode from")
    if isinstance(src_mask, Tensor) and tuple(src_mask.shape) == tuple(src.shape):
        empty = (~src_mask.bool().any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"src rows {empty[:8]} are empty (no real token in src_mask): there is nothing "
                "to decode from; drop them or give each at least one token"
            )


class _Search:
    def __init__(self, model, bos, eos, pad, max_new, min_length, length_penalty):
        self.model, self.bos, self.eos, self.pad = model, bos, eos, pad
        self.max_new, self.min_length, self.lp = max_new, min_length, length_penalty

    # -- one step ------------------------------------------------------------------------------
    def _step_logprobs(self, state: _State, step: int) -> Tensor:
        """(R, V) float32 log-probabilities of the next token of each of the R live rows."""
        if state.cache is not None:
            logits, state.cache = self.model.decode(
                state.last[:, None], None, memory_mask=state.memory_mask, cache=state.cache
            )
        else:  # the reference: the whole prefix again, no cache
            logits = self.model.decode(state.prefix, state.memory, memory_mask=state.memory_mask)
        logits = logits[:, -1].float()  # (R, V)
        if self.pad != self.eos:
            # Padding is what follows an end, never a token: the distribution over the other
            # tokens, in one log-softmax (removing it after a first one and renormalising gives
            # the same values at twice the cost).
            logits = logits.index_fill(1, self._pad_index(logits.device), -math.inf)
        logp = torch.log_softmax(logits, dim=-1)
        if step < self.min_length:
            logp[:, self.eos] = -math.inf
        return logp

    def _pad_index(self, device: torch.device) -> Tensor:
        return torch.tensor([self.pad], device=device)

    # -- greedy --------------------------------------------------------------------------------
    def greedy(self, memory: Tensor, memory_mask: Tensor | None, use_cache: bool) -> Generated:
        B = memory.shape[0]
        tokens = torch.full((B, self.max_new), self.pad, dtype=torch.long, device=memory.device)
        logprobs = torch.zeros(B, self.max_new, device=memory.device)
        lengths = torch.full((B,), self.max_new, dtype=torch.long, device=memory.device)
        state = _State.start(self.model, memory, memory_mask, self.bos, use_cache)
        live = torch.arange(B, device=memory.device)  # (R,) which source each live row is
        for step in range(self.max_new):
            best, token = self._step_logprobs(state, step).max(dim=-1)  # (R,)
            tokens[live, step], logprobs[live, step] = token, best
            ended = token == self.eos
            lengths[live[ended]] = step + 1
            state.append(token)
            if bool(ended.any()):
                keep = (~ended).nonzero().flatten()  # (R',)
                live = live[keep]
                state = state.select(keep)
                if live.numel() == 0:
                    break
        return self._result(tokens, logprobs, lengths)

    # -- beam ----------------------------------------------------------------------------------
    def beam(self, memory, memory_mask, K: int, early_stopping, use_cache: bool) -> Generated:
        B, device = memory.shape[0], memory.device
        rows = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,) source of each row
        # The memory's keys and values are projected once per source, then copied per beam.
        state = _State.start(self.model, memory, memory_mask, self.bos, use_cache).select(rows)
        sources = list(range(B))  # the live sources, in row order (K rows each)
        running = torch.zeros(B * K, device=device)  # (R,) sum of logprobs of each beam
        running.view(B, K)[:, 1:] = -math.inf  # at first every beam is the same: keep one
        history = torch.zeros(B * K, 0, dtype=torch.long, device=device)  # (R, step)
        history_logp = torch.zeros(B * K, 0, device=device)
        ended: list[list[tuple[float, list[int], list[float]]]] = [[] for _ in range(B)]
        for step in range(self.max_new):
            logp = self._step_logprobs(state, step)  # (R, V)
            V = logp.shape[-1]
            total = (running[:, None] + logp).view(len(sources), K * V)  # (B', K*V)
            top, index = total.topk(min(2 * K, K * V), dim=1)  # (B', 2K)
            origin, token = index // V, index % V  # beam within its source, next token
            top_l, origin_l, token_l = top.tolist(), origin.tolist(), token.tolist()
            next_rows, next_tokens, next_sums, done = [], [], [], []
            for i, source in enumerate(sources):
                chosen = []
                for rank in range(top.shape[1]):
                    total_score, beam, tok = top_l[i][rank], origin_l[i][rank], token_l[i][rank]
                    row = i * K + beam
                    if tok == self.eos:
                        # An ending below the top K candidates is not a hypothesis (as in
                        # Hugging Face): it lost to K others already.
                        if rank < K and total_score > -math.inf:
                            self._add(
                                ended[source],
                                K,
                                total_score,
                                history[row].tolist() + [tok],
                                history_logp[row].tolist() + [logp[row, tok].item()],
                            )
                        continue
                    chosen.append((row, tok, total_score))
                    if len(chosen) == K:
                        break
                best_next = top_l[i][0]
                finished = self._done(ended[source], K, best_next, step + 1, early_stopping)
                done.append(finished)
                for row, tok, total_score in chosen:
                    next_rows.append(row)
                    next_tokens.append(tok)
                    next_sums.append(total_score)
            # Explicit dtypes: with no live row (an empty batch) the lists are empty, and an
            # empty tensor would default to float, which cannot index.
            picked = torch.tensor(next_rows, dtype=torch.long, device=device)  # (R,)
            new_tokens = torch.tensor(next_tokens, dtype=torch.long, device=device)
            history = torch.cat([history[picked], new_tokens[:, None]], dim=1)
            history_logp = torch.cat(
                [history_logp[picked], logp[picked, new_tokens][:, None]], dim=1
            )
            running = torch.tensor(next_sums, device=device)
            # Beams move within their own source: the memory rows stay where they are.
            state = state.select(picked, memory=False)
            state.append(new_tokens)
            if any(done):
                keep_sources = [i for i, d in enumerate(done) if not d]
                keep = torch.tensor(
                    [i * K + j for i in keep_sources for j in range(K)],
                    dtype=torch.long,
                    device=device,
                )
                sources = [sources[i] for i in keep_sources]
                state, running = state.select(keep), running[keep]
                history, history_logp = history[keep], history_logp[keep]
                if not sources:
                    break
        # Sources still running at the limit: their beams end there, without an end token.
        for i, source in enumerate(sources):
            for j in range(K):
                row = i * K + j
                self._add(
                    ended[source],
                    K,
                    running[row].item(),
                    history[row].tolist(),
                    history_logp[row].tolist(),
                )
        return self._best(ended, device)

    def _score(self, total: float, length: int) -> float:
        return total / length**self.lp

    def _add(self, hyps, K, total, tokens, logps) -> None:
        """Keep the K best ended hypotheses of a source."""
        if total == -math.inf:
            return
        hyps.append((self._score(total, len(tokens)), tokens, logps))
        hyps.sort(key=lambda h: h[0], reverse=True)
        del hyps[K:]

    def _done(self, hyps, K, best_total, length, early_stopping) -> bool:
        if len(hyps) < K:
            return False
        if early_stopping is True:
            return True
        worst = hyps[-1][0]
        if early_stopping is False:
            return worst >= self._score(best_total, length)
        bound_length = self.max_new if self.lp > 0 else length
        return worst >= self._score(best_total, bound_length)

    def _best(self, ended, device) -> Generated:
        B = len(ended)
        tokens = torch.full((B, self.max_new), self.pad, dtype=torch.long, device=device)
        logprobs = torch.zeros(B, self.max_new, device=device)
        lengths = torch.zeros(B, dtype=torch.long, device=device)
        for b, hyps in enumerate(ended):
            _, seq, logps = hyps[0]
            tokens[b, : len(seq)] = torch.tensor(seq, device=device)
            logprobs[b, : len(seq)] = torch.tensor(logps, device=device)
            lengths[b] = len(seq)
        return self._result(tokens, logprobs, lengths)

    def _result(self, tokens, logprobs, lengths) -> Generated:
        longest = int(lengths.max()) if lengths.numel() else 0
        scores = logprobs.sum(dim=1) / lengths.clamp(min=1).float() ** self.lp
        return Generated(tokens[:, :longest], lengths, scores, logprobs[:, :longest])


class _State:
    """The live rows of a search: their cache (or, without one, their whole prefix), the
    memory they attend, its mask, and each row's last token."""

    def __init__(self, cache, memory, memory_mask, prefix, last):
        self.cache, self.memory, self.memory_mask = cache, memory, memory_mask
        self.prefix, self.last = prefix, last

    @classmethod
    def start(cls, model, memory, memory_mask, bos, use_cache) -> _State:
        B = memory.shape[0]
        first = torch.full((B,), bos, dtype=torch.long, device=memory.device)
        cache = model.decoder.start_cache(memory) if use_cache else None
        return cls(cache, memory, memory_mask, first[:, None], first)

    def append(self, token: Tensor) -> None:
        self.last = token
        self.prefix = torch.cat([self.prefix, token[:, None]], dim=1)  # (R, t + 1)

    def select(self, rows: Tensor, *, memory: bool = True) -> _State:
        """Rows ``rows`` of this state; ``memory=False`` when rows move only among the beams
        of one source, whose memory is the same."""
        cache = None if self.cache is None else self.cache.select(rows, memory=memory)
        mem, mask = self.memory, self.memory_mask
        if memory:
            mem = mem.index_select(0, rows)
            mask = None if mask is None else mask.index_select(0, rows)
        return _State(cache, mem, mask, self.prefix.index_select(0, rows), self.last[rows])

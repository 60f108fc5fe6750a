"""Attention on packed rows: ``(N, H, Dh)`` real tokens of B sequences, split by ``cu_seqlens``.

Each sequence attends only to itself, so no padding enters any matrix product.

Implementations (``method``), all returning the same values:

``sequence``  one fused SDPA call per run of consecutive, equally long sequences, on a
              ``(G, H, L, Dh)`` strided view. The CPU flash kernel takes 4-D inputs only; a 3-D
              ``(H, L, Dh)`` view silently falls back to the slower unfused math kernel.
``padded``    attention alone on a padded copy: one gather into ``(B, L_max)``, one masked SDPA
              call, one gather back. Linear layers still skip the padding; attention does not,
              but it makes one call per layer instead of one per sequence.
``threads``   ``sequence``'s calls, the runs grouped over the intra-op threads, each group on a
              single-threaded worker (:mod:`.varlen_threads`): no parallel region to wait in.
``flash``     ``flash_attn_varlen_func`` (CUDA, half precision, when the package is installed).
``avx512``    clearformer's own C++ kernel for AVX-512 CPUs (:mod:`.avx512`, built on request):
              float32 (bfloat16 rows widened for it), plain bidirectional attention without
              gradients; calls it cannot
              serve (causal, a window, a bias, dropout, grouped keys) run as ``auto`` would
              without it.

Grouped-query attention (keys and values with Hkv < H heads): ``sequence``, ``padded`` and
``threads`` hand the grouped rows to SDPA with ``enable_gqa`` and ``flash`` to
``flash_attn_varlen_func``, which both read each group's keys in place; the AVX-512 kernel reads
one key/value head per query head, so it declines grouped calls rather than repeat them.

``auto`` takes ``flash`` when it can serve the call, and ``avx512`` once it is built where this
CPU measured it faster than PyTorch's route (:func:`.avx512.route`, :mod:`clearformer.calibration`).
Otherwise on CPU it takes ``threads`` (``sequence`` for a single run or a single-threaded
caller): every call of ``sequence`` is an OpenMP parallel region, and when other processes
compete for the cores each region can wait for a descheduled thread, so ``sequence`` collapses
under load where ``threads`` does not; on a quiet machine ``threads`` is slower than
``sequence`` for attention alone. Elsewhere (CUDA without flash_attn) ``sequence`` up to
``MAX_SEQUENCE_CALLS`` calls, ``padded`` above. The measurements behind these rules are in
``docs/performance.md``; two more methods that lost (``bucket``, ``nested``) live with the
benchmark, in :mod:`clearformer.bench.varlen_methods`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import switches
from ..checks import check_choice
from ..masks import band_mask, fold_causal
from ..options import VARLEN_METHODS, Decision
from ..padding import PackedLayout, equal_length_runs
from ..reference import scaled_dot_product as reference_attention
from . import avx512
from .local import banded_attention, use_banded
from .sdpa_call import sdpa
from .varlen_threads import threaded_attention

__all__ = [
    "MAX_SEQUENCE_CALLS",
    "VarlenCall",
    "avx512_serves",
    "equal_length_runs",
    "flash_serves",
    "resolve_method",
    "varlen_attention",
]

# Above this many attention calls per layer, ``auto`` takes ``padded`` over ``sequence``.
MAX_SEQUENCE_CALLS = 8


def _flash_attn_varlen():
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


def flash_available(device: torch.device, dtype: torch.dtype, head_dim: int | None = None) -> bool:
    """``flash_attn_varlen_func`` can serve rows on ``device`` in ``dtype`` (CUDA, fp16/bf16)
    with heads ``head_dim`` wide (at most 256, a multiple of 8; None: not checked)."""
    return (
        device.type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
        and (head_dim is None or (head_dim <= 256 and head_dim % 8 == 0))
        and _flash_attn_varlen() is not None
    )


@dataclass(frozen=True)
class VarlenCall:
    """What one layer's packed attention asks of a method: the facts each method serves or not.

    Attributes:
        device, dtype: where the rows are and their dtype.
        head_dim: the heads' width (None: not known, not checked).
        is_causal: token i sees tokens j <= i of its sequence.
        window: a local window applies.
        bias: an additive score bias applies (a relative position bias).
        dropout: dropout on the attention probabilities.
        grad: gradients flow through the call.
        grouped: keys and values have fewer heads than the queries (grouped-query attention).
    """

    device: torch.device
    dtype: torch.dtype = torch.float32
    head_dim: int | None = None
    is_causal: bool = False
    window: bool = False
    bias: bool = False
    dropout: bool = False
    grad: bool = False
    grouped: bool = False


def flash_serves(call: VarlenCall) -> Decision:
    """``serves`` or ``declines`` the call, and why (``flash_attn_varlen_func``)."""
    if call.window or call.bias:
        # flash_attn's own window is not wired in, and it takes no additive bias.
        return Decision("declines", "flash_attn takes no window or bias here")
    if not flash_available(call.device, call.dtype, call.head_dim):
        return Decision("declines", "needs CUDA half precision and the flash_attn package")
    return Decision("serves", "CUDA half precision with flash_attn installed")


def avx512_serves(call: VarlenCall) -> Decision:
    """``serves`` or ``declines`` the call, and why (clearformer's AVX-512 kernel: float32 or
    bfloat16 CPU rows, heads a multiple of 16 wide, plain bidirectional attention without
    gradients)."""
    if call.window or call.bias or call.is_causal or call.dropout:
        return Decision("declines", "the AVX-512 kernel takes no window, bias, causal or dropout")
    if call.grad:
        return Decision("declines", "the AVX-512 kernel has no backward")
    if call.grouped:
        return Decision("declines", "the AVX-512 kernel reads one key/value head per query head")
    if not (
        call.device.type == "cpu"
        and call.dtype in (torch.float32, torch.bfloat16)
        and (call.head_dim is None or call.head_dim % 16 == 0)
    ):
        return Decision(
            "declines", "the AVX-512 kernel needs float32 or bfloat16 CPU rows, heads of 16k"
        )
    return Decision("serves", "clearformer's AVX-512 kernel (built, on an AVX-512 CPU)")


def resolve_method(
    method: str,
    layout: PackedLayout,
    *,
    call: VarlenCall | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    head_dim: int | None = None,
    is_causal: bool = False,
    avx512_route: Decision | None = None,
) -> Decision:
    """The implementation ``method`` runs on for ``call`` (or the call these keywords
    describe), and why. ``auto`` takes the first method that serves the call: ``flash``, then
    ``avx512`` where ``avx512_route`` (default: :func:`.avx512.route`, whether this process
    takes the kernel) says so, then the CPU or CUDA rule among ``threads``, ``sequence``,
    ``padded`` (which serve every call). A method named explicitly that cannot serve raises."""
    check_choice(method, VARLEN_METHODS, "method")
    if call is None:
        if device is None:
            raise ValueError("resolve_method needs a call or a device")
        call = VarlenCall(device, dtype, head_dim, is_causal, grad=torch.is_grad_enabled())
    if method == "auto":
        flash, kernel = flash_serves(call), avx512_serves(call)
        if flash.choice == "serves":
            return Decision("flash", flash.reason)
        not_taken = ""
        if call.device.type == "cpu" and avx512.support().choice == "available":
            if kernel.choice == "serves":
                kernel_name = avx512.attention_kernel(call.dtype)  # its verdict for this dtype
                taken = avx512.route(kernel_name) if avx512_route is None else avx512_route
                if taken.choice == "avx512":
                    return Decision("avx512", taken.reason)
                not_taken = f"; not avx512: {taken.reason}"
            else:
                # The kernel is there but cannot take this call (half-precision rows, a
                # causal mask): the method taken instead says so.
                not_taken = f"; avx512 declines: {kernel.reason}"
        fallback = _pytorch_method(layout, call)
        return Decision(fallback.choice, fallback.reason + not_taken)
    if method == "avx512":
        off = switches.all_off()
        if off is not None:
            raise ValueError(f"method='avx512' cannot run here: {off.reason}")
        loaded = avx512.load(build=True)
        if loaded.choice != "loaded":
            raise ValueError(f"method='avx512' cannot run here: {loaded.reason}")
        served = avx512_serves(call)
        if served.choice != "serves":
            raise ValueError(
                f"method='avx512' cannot serve this call ({served.reason}): device="
                f"{call.device}, dtype={call.dtype}, head_dim={call.head_dim}"
            )
    if method == "flash" and flash_serves(call).choice != "serves":
        raise ValueError(
            "method='flash' needs CUDA tensors in float16/bfloat16, heads at most 256 wide in "
            f"multiples of 8 and the flash_attn package, and no window or bias, got "
            f"device={call.device}, dtype={call.dtype}, head_dim={call.head_dim}"
        )
    return Decision(method, "requested by name")


def _pytorch_method(layout: PackedLayout, call: VarlenCall) -> Decision:
    """What ``auto`` takes among PyTorch's kernels (``threads``, ``sequence``, ``padded``)."""
    calls = len(layout.runs)
    if call.device.type == "cpu":
        if torch.get_num_threads() == 1:
            # No parallel region, nothing to wait for: one call per run is the fastest.
            return Decision("sequence", "a single-threaded caller: one call per run")
        if calls > 1:
            # No OpenMP region to wait in when other processes take the cores; slower
            # than `sequence` on free cores (docs/performance.md).
            return Decision(
                "threads", f"{calls} runs grouped over {torch.get_num_threads()} threads"
            )
    if calls <= MAX_SEQUENCE_CALLS:
        return Decision("sequence", f"{calls} call(s) of fused attention per layer")
    return Decision(
        "padded", f"{calls} runs of equal lengths > {MAX_SEQUENCE_CALLS}: one padded call"
    )


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: PackedLayout,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    reference: bool = False,
    method: str = "auto",
    window: int | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Self-attention within each packed sequence.

    Args:
        q: (N, H, Dh); k: (N, Hkv, Dh); v: (N, Hkv, Dv), Hkv dividing H (grouped-query
            attention); rows ordered as ``layout.offsets`` says.
        layout: where each sequence starts (see :class:`clearformer.padding.PackedLayout`).
        is_causal: token i of a sequence sees tokens j <= i of the same sequence.
        dropout_p: dropout on the attention probabilities.
        scale: score scale, default 1 / sqrt(Dh).
        reference: run the explicit ``math`` formula per sequence (for tests and explain).
        method: one of ``VARLEN_METHODS`` (see the module docstring).
        window: local attention: token i sees tokens j of its sequence with |i - j| <= window;
            None = the whole sequence.
        bias: (H, L, L) float added to the scores of every sequence (its top-left corner, for
            a shorter one): a relative position bias. None: no bias.

    Returns:
        (N, H, Dv). Rows of an empty sequence do not exist, so nothing needs zeroing.
    """
    check_choice(method, VARLEN_METHODS, "method")
    if window is not None and bias is not None:
        raise ValueError("a relative position bias with a local window is not supported")
    if layout.num_tokens == 0:  # no rows: nothing to attend, whatever the method
        return v.new_zeros(0, q.shape[1], v.shape[2])
    if reference:
        return _per_sequence(
            q, k, v, layout, is_causal, dropout_p, scale, window, bias, reference=True
        )
    call = VarlenCall(
        q.device,
        q.dtype,
        q.shape[-1],
        is_causal,
        window is not None,
        bias is not None,
        dropout_p > 0.0,
        torch.is_grad_enabled() and q.requires_grad,
        grouped=k.shape[1] != q.shape[1],
    )
    if method == "avx512":
        off = switches.all_off()
        if off is not None:  # a kernel named with every kernel off: refused, not ignored
            raise ValueError(f"method='avx512' cannot run here: {off.reason}")
        if avx512_serves(call).choice != "serves":
            method = "auto"  # a call the kernel does not serve: what auto takes without it
    if method in ("auto", "flash"):
        # A named flash call it cannot serve raises, naming what it needs.
        method = resolve_method(method, layout, call=call).choice
    if method == "avx512":
        if avx512.serves(q, k, v):
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            return avx512.attention(q, k, v, layout.cu_seqlens, scale)
        method = "sequence"  # rows the kernel cannot read as they are laid out
    if method == "flash":
        return _flash_attn_varlen()(
            q,
            k,
            v,
            layout.cu_seqlens,
            layout.cu_seqlens,
            layout.max_seqlen,
            layout.max_seqlen,
            dropout_p=dropout_p,
            softmax_scale=scale,
            causal=is_causal,
        )
    if method == "padded":
        return _padded(q, k, v, layout, is_causal, dropout_p, scale, window, bias)
    if method == "threads" and dropout_p == 0.0:

        def attend_runs(qs, ks, vs, runs):
            return _per_sequence(
                qs,
                ks,
                vs,
                layout,
                is_causal,
                0.0,
                scale,
                window,
                bias,
                reference=False,
                runs=runs,
                join=False,
            )

        return threaded_attention(q, k, v, layout, is_causal, scale, window, bias, attend_runs)
    return _per_sequence(
        q, k, v, layout, is_causal, dropout_p, scale, window, bias, reference=False
    )


def _per_sequence(
    q, k, v, layout, is_causal, dropout_p, scale, window, bias, *, reference, runs=None, join=True
) -> Tensor | list[Tensor]:
    """One fused call per run of ``runs`` (default: all of the layout's), which tile the rows of
    ``q``, ``k``, ``v`` in order. ``join=False`` returns the runs' outputs unconcatenated (the
    ``threads`` method joins every worker's pieces in one concatenation)."""
    H, Dv = q.shape[1], v.shape[2]  # keys and values may have fewer heads (grouped)
    runs = layout.runs if runs is None else runs
    if not runs:
        return v.new_zeros(0, H, Dv) if join else []
    # The runs tile the N rows in order. One split per tensor (not a slice per run): in backward
    # a split concatenates the pieces' gradients in one pass, where B slices would each fill and
    # add a zero (N, H, Dh) gradient, B times per layer.
    sizes = [count * length for _, count, length in runs]
    pieces = []
    for (_, count, length), qs, ks, vs in zip(
        runs, q.split(sizes), k.split(sizes), v.split(sizes), strict=True
    ):
        # (G*L, heads, Dh) -> (G, L, heads, Dh) -> (G, heads, L, Dh): a strided view that the
        # flash kernel (4-D inputs only) reads without a copy.
        qs, ks, vs = (t.view(count, length, t.shape[1], -1).transpose(1, 2) for t in (qs, ks, vs))
        # A window inside one sequence: every query keeps at least itself, so no row is empty.
        needs_band = window is not None and window < length - 1
        if needs_band and not reference and use_banded(length, window):
            out = banded_attention(
                qs, ks, vs, window, is_causal=is_causal, dropout_p=dropout_p, scale=scale
            )
            pieces.append(out.transpose(1, 2).reshape(count * length, H, Dv))
            continue
        band = band_mask(length, window, q.device) if needs_band else None
        corner = None if bias is None else bias[:, :length, :length]  # (H, L, L)
        if reference:
            allowed = fold_causal(band, length, length, q.device) if is_causal else band
            out, _ = reference_attention(
                qs, ks, vs, allowed, bias=corner, dropout_p=dropout_p, scale=scale
            )
        elif corner is not None:
            allowed = band
            if is_causal:
                allowed = fold_causal(allowed, length, length, q.device)
            additive = corner.to(q.dtype)  # (H, L, L), broadcast over the G sequences
            if allowed is not None:
                additive = additive.masked_fill(~allowed, float("-inf"))  # keeps the diagonal
            out = sdpa(qs, ks, vs, attn_mask=additive, dropout_p=dropout_p, scale=scale)
        elif band is not None:
            if is_causal:
                band = fold_causal(band, length, length, q.device)
            out = sdpa(qs, ks, vs, attn_mask=band, dropout_p=dropout_p, scale=scale)
        else:
            out = sdpa(qs, ks, vs, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        # (G, H, L, Dv) -> (G, L, H, Dv) -> (G*L, H, Dv); a view for the flash kernel's output.
        pieces.append(out.transpose(1, 2).reshape(count * length, H, Dv))
    if not join:
        return pieces
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat(pieces, dim=0)  # (N, H, Dv)


def _padded(q, k, v, layout, is_causal, dropout_p, scale, window, bias) -> Tensor:
    N, H, Dv = v.shape[0], q.shape[1], v.shape[2]
    B, L = layout.batch, max(layout.max_seqlen, 1)
    lengths = torch.tensor(layout.lengths, device=q.device)  # (B,)
    starts = torch.tensor(layout.offsets[:-1], device=q.device)  # (B,)
    steps = torch.arange(L, device=q.device)  # (L,)
    real = steps[None, :] < lengths[:, None]  # (B, L) True = real token
    # Padded slots read row 0 of the batch (finite values); their keys are masked out and
    # their outputs dropped. With no rows at all there is nothing to attend.
    if N == 0:
        return v.new_zeros(0, H, Dv)
    rows = torch.where(real, starts[:, None] + steps[None, :], 0).reshape(-1)  # (B*L,)
    qs, ks, vs = (
        t.index_select(0, rows).view(B, L, t.shape[1], -1).transpose(1, 2) for t in (q, k, v)
    )  # (B, heads, L, Dh)
    mask = real[:, None, None, :]  # (B, 1, 1, L) keys
    if is_causal:
        mask = mask & torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    if window is not None and use_banded(L, window):
        # Long sequences: slab by slab, never a (B, 1, L, L) band (nor SDPA's float bias).
        out = banded_attention(
            qs,
            ks,
            vs,
            window,
            real[:, None, None, :],
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
        ).transpose(1, 2)  # (B, L, H, Dv)
        keep = real.reshape(-1).nonzero().flatten()  # (N,)
        return out.reshape(B * L, H, Dv).index_select(0, keep)
    if window is not None:
        mask = mask & band_mask(L, window, q.device)
    # A padded slot with no key in reach (an empty sequence's, or one beyond the window of
    # every real token) would give NaN: let it attend everywhere (finite); it is dropped.
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    attn_mask = mask
    if bias is not None:
        # (1, H, L, L) bias, -inf where the (B, 1, L|1, L) mask forbids: (B, H, L, L).
        attn_mask = bias[None, :, :L, :L].to(q.dtype).masked_fill(~mask, float("-inf"))
    out = sdpa(qs, ks, vs, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale).transpose(
        1, 2
    )  # (B, L, H, Dv)
    keep = real.reshape(-1).nonzero().flatten()  # (N,) positions of the real tokens
    return out.reshape(B * L, H, Dv).index_select(0, keep)  # (N, H, Dv)

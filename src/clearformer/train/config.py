"""The training configuration: one flat, validated dataclass (``TrainConfig``).

Flat on purpose: every field is one CLI flag (``lr`` -> ``--lr``) and one TOML key, so a run's
``config.toml`` and its command line say the same thing in the same words. The groups below are
only comments.

Validation happens in ``__post_init__`` (before any data or model is touched); what needs the
data (a batch larger than the dataset) is checked by :func:`check_against_data` once the task
has loaded it, still before the first step.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..checks import ArgumentTypeError, check_choice, check_int, check_positive_int
from ..options import RERANK_FUSIONS

TASKS = ("digits", "classify", "reverse", "mlm", "translate", "contrastive", "rerank")
DECAYS = ("cosine", "linear", "constant")
PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
MODES = ("max", "min")  # and "": the metric's own direction (LOWER_IS_BETTER: min)
LOWER_IS_BETTER = ("loss", "perplexity")
POOLINGS = ("cls", "mean")
PATCHES = ("2x2", "4x4", "row")
DISTRIBUTED = ("none", "ddp", "fsdp")
BATCHINGS = ("packed", "padded")
TEXT_UNITS = ("line", "paragraph")
RERANK_LOSSES = ("bce", "listwise")
# The allowed values of each field that has a fixed set (the CLI offers them as choices).
CHOICES = {
    "task": TASKS,
    "decay": DECAYS,
    "precision": PRECISIONS,
    "device": DEVICES,
    "mode": MODES,
    "pooling": POOLINGS,
    "patch": PATCHES,
    "distributed": DISTRIBUTED,
    "batching": BATCHINGS,
    "text_unit": TEXT_UNITS,
    "rerank_loss": RERANK_LOSSES,
    "rerank_fusion": RERANK_FUSIONS,
}

# The peak learning rate of each task when none is given: the tasks that fine-tune a
# pretrained model take sentence-transformers' default (at 1e-3 a pretrained embedder loses
# what it knew within a few steps); the others train from scratch, or a small new head.
TASK_LR = {"contrastive": 5e-5, "rerank": 5e-5}
DEFAULT_LR = 1e-3

# The fields only some tasks read (every other field, every task reads), and the tasks that
# do: TrainConfig refuses another value than the default for any other task.
TASK_FIELDS = {
    "train_file": ("classify", "mlm", "translate", "contrastive", "rerank"),
    "eval_file": ("classify", "mlm", "translate"),
    "model": ("classify", "mlm", "contrastive", "rerank"),
    "from_scratch": ("classify", "mlm"),
    "max_length": ("classify", "mlm", "contrastive", "rerank"),
    "batching": ("classify", "mlm"),
    "text_field": ("classify", "mlm"),
    "label_field": ("classify",),
    "d_model": ("digits", "reverse", "translate"),
    "n_heads": ("digits", "reverse", "translate"),
    "n_layers": ("digits", "reverse", "translate"),
    "dim_mlp": ("digits", "reverse", "translate"),
    "dropout": ("digits", "classify", "reverse", "translate"),
    "pooling": ("digits", "classify"),
    "patch": ("digits",),
    "eval_fraction": ("digits", "classify", "mlm", "translate", "contrastive", "rerank"),
    "text_unit": ("mlm",),
    "source_field": ("translate",),
    "target_field": ("translate",),
    "vocab_min_count": ("translate",),
    "vocab_max_size": ("translate",),
    "translate_max_length": ("translate",),
    "reverse_vocab": ("reverse",),
    "reverse_min_length": ("reverse",),
    "reverse_max_length": ("reverse",),
    "reverse_examples": ("reverse",),
    "eval_data": ("contrastive", "rerank"),
    "eval_split": ("contrastive", "rerank"),
    "negatives": ("contrastive", "rerank"),
    "mini_batch_size": ("contrastive",),
    "scale": ("contrastive",),
    "symmetric": ("contrastive",),
    "matryoshka_dims": ("contrastive",),
    "query_prompt": ("contrastive",),
    "document_prompt": ("contrastive",),
    "rerank_loss": ("rerank",),
    "retriever": ("rerank",),
    "rerank_top": ("rerank",),
    "rerank_fusion": ("rerank",),
}
# contrastive and rerank: what they read only with eval_data (its split; rerank's first stage),
# and only without it (the rows held out in its place).
WITH_EVAL_DATA = ("eval_split", "retriever", "rerank_top", "rerank_fusion")
WITHOUT_EVAL_DATA = ("eval_fraction", "split_seed")

# Fields that decide the parameters' shapes: a resume that changes one is refused, since the
# checkpoint's tensors cannot be loaded into a model of another shape.
SHAPE_FIELDS = (
    "task",
    "d_model",
    "n_heads",
    "n_layers",
    "dim_mlp",
    "pooling",
    "patch",
    "model",
    "from_scratch",
    "text_field",
    "label_field",
    "train_file",
    "source_field",
    "target_field",
    "translate_max_length",
    "reverse_vocab",
    "reverse_max_length",
)
# Fields that decide which examples each step sees: a resume that changes one would not go on
# with the same run, so it is refused too.
DATA_ORDER_FIELDS = (
    "seed",
    "batch_size",
    "eval_file",
    "eval_fraction",
    "split_seed",
    "max_length",
    "text_unit",
    "reverse_min_length",
    "reverse_examples",
    "eval_data",
    "eval_split",
    "mini_batch_size",
    "scale",
    "symmetric",
    "matryoshka_dims",
    "query_prompt",
    "document_prompt",
    "negatives",
    "rerank_loss",
)
# Fields that change nothing already computed: a resume that changes one is a warning only.
HARMLESS_FIELDS = (
    "eval_every",
    "log_every",
    "checkpoint_every",
    "keep_last",
    "device",
    "retriever",
    "rerank_top",
    "rerank_fusion",
)
# Of those, the ones that change the evaluation's metric itself: the best score so far was
# measured another way than the evaluations after the resume, which early stopping and the
# best checkpoint compare with it.
METRIC_FIELDS = ("retriever", "rerank_top", "rerank_fusion")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run (the output folder is not part of it)."""

    # digits (bundled 8x8 images) | classify (CSV/JSONL text, label) | reverse (generated
    # sequences, encoder-decoder) | mlm (plain text, masked words) | translate (sentence pairs)
    task: str = "digits"
    seed: int = 0  # parameters, dropout and data order; two runs with one seed are bitwise equal

    # Steps and batches.
    steps: int = 1500  # optimizer steps in the whole run
    batch_size: int = 64  # examples per optimizer step (all micro-batches together)
    accumulation: int = 1  # micro-batches per step: memory of batch_size / accumulation

    # AdamW.
    lr: float = 0.0  # peak lr, after warm-up; 0: the task's (5e-5 contrastive/rerank, else 1e-3)
    weight_decay: float = 0.01  # decoupled (AdamW); not applied to biases and norms
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_norm: float = 1.0  # gradient clipping by global L2 norm; 0: no clipping

    # Learning-rate schedule (schedule.py): linear warm-up, then decay toward min_lr_ratio * lr,
    # which the step after the last would reach (the last step is one decay step above it).
    # Warm-up step i at lr * (i + 1) / warmup_steps: the last reaches lr (a run shorter than its
    # warm-up ends before the peak, as a short trial run may).
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine | linear | constant
    min_lr_ratio: float = 0.0  # final lr as a fraction of lr

    # Numerics and memory.
    precision: str = "fp32"  # fp32 | bf16 (autocast, CPU or GPU) | fp16 (GPU only, grad scaler)
    device: str = "auto"  # auto (cuda when present) | cpu | cuda
    checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    # Under torchrun: ddp (parameters replicated) | fsdp (sharded, distributed checkpoints).
    distributed: str = "none"

    # Evaluation, early stopping and checkpoints.
    eval_every: int = 100  # steps between evaluations (and one at the last step)
    log_every: int = 10  # steps between training-loss records
    checkpoint_every: int = 100  # steps between checkpoints (and one at the last step)
    keep_last: int = 2  # complete checkpoints kept, besides the best one
    metric: str = ""  # the metric that picks the best checkpoint; "": the task's (accuracy)
    mode: str = ""  # max: larger is better (accuracy) | min (loss) | "": the metric's own
    patience: int = 0  # evaluations without improvement before stopping; 0: never stop early
    min_delta: float = 0.0  # an improvement must beat the best by more than this

    # Model trained from scratch (digits, or classify with from_scratch).
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    dim_mlp: int = 128
    dropout: float = 0.1
    pooling: str = "cls"  # cls (a learned first token) | mean (of the real tokens)

    # digits: 8x8 images as a sequence of patches, a fixed stratified split.
    patch: str = "2x2"  # 2x2 (16 tokens of 4 pixels) | 4x4 (4 of 16) | row (8 of 8)
    eval_fraction: float = 0.2  # held out for evaluation (classify: when no eval_file)
    split_seed: int = 0  # the held-out split; fixed so every seed is scored on one test set

    # classify: text classification.
    train_file: str = ""  # CSV (header with text, label) or JSONL ({"text":..., "label":...})
    eval_file: str = ""  # "": hold out eval_fraction of train_file, stratified
    text_field: str = "text"
    label_field: str = "label"
    model: str = "bundled"  # a checkpoint directory to fine-tune; bundled: all-MiniLM-L6-v2
    from_scratch: bool = False  # keep the checkpoint's tokenizer, start from random weights
    max_length: int = 128  # tokens kept per text
    # packed: ids (N,) + cu_seqlens, no padding reaches the model | padded: (B, T) + mask
    batching: str = "packed"

    # translate: sentence pairs from train_file (TSV with a header, or JSONL; "auf-deutsch": that
    # package's German-English pairs), word-level vocabularies built from the training half.
    source_field: str = "source"  # TSV column / JSONL field of the source sentence
    target_field: str = "target"  # TSV column / JSONL field of its translation
    vocab_min_count: int = 1  # a word seen fewer times in the training pairs reads as <unk>
    vocab_max_size: int = 0  # words per vocabulary, the most frequent (specials aside); 0: all
    translate_max_length: int = 64  # words per sentence; longer pairs are left out (and counted)

    # reverse: random token sequences, written backwards by an encoder-decoder (the seed's demo).
    reverse_vocab: int = 20  # symbols besides padding, start and end
    reverse_min_length: int = 3
    reverse_max_length: int = 16
    reverse_examples: int = 20_000  # training sequences; a tenth as many are held out

    # mlm: masked-language modelling on plain text (train_file: .txt, or JSONL with text_field;
    # model, from_scratch, max_length, eval_file, eval_fraction as for classify).
    text_unit: str = "line"  # a .txt file's texts: line (each non-blank one) | paragraph

    # contrastive: retrieval fine-tuning on train_file rows (anchor, positive, negative); model
    # and max_length as for classify. See docs/retrieval.md.
    eval_data: str = ""  # a BEIR folder: NDCG@10 before training and at each evaluation
    eval_split: str = "dev"  # its qrels file evaluated (never the test split while tuning)
    mini_batch_size: int = 0  # GradCache: texts embedded at a time with gradients; 0: all at once
    scale: float = 20.0  # cosine x scale are the logits (sentence-transformers' MNRL default)
    symmetric: bool = False  # also each positive picking its anchor; the two losses averaged
    matryoshka_dims: str = ""  # "384,256,128": the loss summed at each width; "": full width only
    query_prompt: str = ""  # put before every anchor ("query: ")
    document_prompt: str = ""  # put before every positive and negative ("passage: ")
    negatives: int = 0  # hard negatives per row used; 0: every one the row has
    # rerank: a cross-encoder trained on the same rows.
    # bce: each pair labelled 1 / 0 (binary cross-entropy) | listwise: each row's positive
    # against its own negatives (softmax cross-entropy over the row's pairs)
    rerank_loss: str = "bce"
    retriever: str = "bundled"  # the fixed first stage whose results eval_data's run reranks
    rerank_top: int = 50  # documents per query the cross-encoder reranks at each evaluation
    rerank_fusion: str = "none"  # evaluation: none | rrf (the reranked order fused with the first)

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
            if f.type == "float":  # TOML's `lr = 1` is an int: keep one spelling per field
                object.__setattr__(self, f.name, float(getattr(self, f.name)))
        for name, allowed in CHOICES.items():
            if name == "mode" and self.mode == "":
                continue  # the metric's own direction, resolved by resolve_mode
            check_choice(getattr(self, name), allowed, name)
        for name in ("steps", "batch_size", "accumulation", "eval_every", "log_every"):
            check_positive_int(getattr(self, name), name)
        for name in ("checkpoint_every", "keep_last", "d_model", "n_heads", "n_layers"):
            check_positive_int(getattr(self, name), name)
        for name in ("dim_mlp", "max_length"):
            check_positive_int(getattr(self, name), name)
        for name in ("warmup_steps", "patience", "seed", "split_seed"):
            check_int(getattr(self, name), name)
        if self.accumulation > self.batch_size:
            raise ValueError(
                f"accumulation must be at most batch_size={self.batch_size} (each micro-batch "
                f"needs an example), got {self.accumulation}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model must be divisible by n_heads={self.n_heads}, got {self.d_model}"
            )
        if self.lr == 0.0:
            object.__setattr__(self, "lr", TASK_LR.get(self.task, DEFAULT_LR))
        _check_range("lr", self.lr, low=0.0, low_open=True)
        _check_range("weight_decay", self.weight_decay, low=0.0)
        _check_range("beta1", self.beta1, low=0.0, high=1.0, high_open=True)
        _check_range("beta2", self.beta2, low=0.0, high=1.0, high_open=True)
        _check_range("eps", self.eps, low=0.0, low_open=True)
        _check_range("clip_norm", self.clip_norm, low=0.0)
        _check_range("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        _check_range("min_delta", self.min_delta, low=0.0)
        _check_range("dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        _check_range(
            "eval_fraction", self.eval_fraction, low=0.0, high=1.0, low_open=True, high_open=True
        )
        if self.metric in LOWER_IS_BETTER and self.mode == "max":
            raise ValueError(
                f"mode must be 'min' (or '') for metric={self.metric!r} (lower is better), "
                "got mode='max'"
            )
        for name in ("vocab_min_count", "translate_max_length"):
            check_positive_int(getattr(self, name), name)
        check_int(self.vocab_max_size, "vocab_max_size")
        if self.task == "translate" and not self.train_file:
            raise ValueError(
                "train_file must name a TSV or JSONL file (or 'auf-deutsch') for "
                "task='translate', got ''"
            )
        for name in ("reverse_vocab", "reverse_min_length", "reverse_max_length"):
            check_positive_int(getattr(self, name), name)
        check_positive_int(self.reverse_examples, "reverse_examples")
        if self.reverse_min_length > self.reverse_max_length:
            raise ValueError(
                f"reverse_min_length must be <= reverse_max_length={self.reverse_max_length}, "
                f"got {self.reverse_min_length}"
            )
        if self.task == "classify" and not self.train_file:
            raise ValueError("train_file must name a CSV or JSONL file for task='classify', got ''")
        generated = {"digits": "the bundled images", "reverse": "generated sequences"}
        if self.task in generated:
            given = [n for n in ("train_file", "eval_file") if getattr(self, n)]
            if given:
                raise ValueError(
                    f"{given[0]} is for task='classify', 'mlm' or 'translate'; "
                    f"task={self.task!r} uses {generated[self.task]}, "
                    f"got {given[0]}={getattr(self, given[0])!r}"
                )
        check_int(self.mini_batch_size, "mini_batch_size")
        check_int(self.negatives, "negatives")
        for name in ("mini_batch_size", "negatives"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        _check_range("scale", self.scale, low=0.0, low_open=True)
        check_positive_int(self.rerank_top, "rerank_top")
        if self.task == "rerank" and not self.train_file:
            raise ValueError(
                "train_file must name a JSONL, CSV or TSV file of (anchor, positive, negative) "
                "rows for task='rerank', got ''"
            )
        if self.task == "contrastive":
            if not self.train_file:
                raise ValueError(
                    "train_file must name a JSONL, CSV or TSV file of (anchor, positive, "
                    "negative) rows for task='contrastive', got ''"
                )
            if self.distributed == "fsdp":
                raise ValueError(
                    "distributed must be 'none' or 'ddp' for task='contrastive' (its embedding "
                    "model is small enough to replicate), got 'fsdp'"
                )
            if self.accumulation != 1:
                raise ValueError(
                    "accumulation must be 1 for task='contrastive' (in-batch negatives couple "
                    f"the whole batch; use mini_batch_size for memory), got {self.accumulation}"
                )
        if self.task == "mlm" and not self.train_file:
            raise ValueError("train_file must name a .txt or JSONL file for task='mlm', got ''")
        self._refuse_unread_fields()

    def _refuse_unread_fields(self) -> None:
        """A field the task does not read, given another value than its default, is refused:
        it would be ignored in silence (a query_prompt for a reranker, an eval_file for
        contrastive rows). Defaults pass, so a config written by --print-config loads back."""
        defaults = {f.name: f.default for f in fields(self)}
        for name, tasks in TASK_FIELDS.items():
            value = getattr(self, name)
            if self.task not in tasks and value != defaults[name]:
                raise ValueError(
                    f"{name} is for task={_either(tasks)}; task={self.task!r} does not read "
                    f"it, got {name}={value!r}"
                )
        if self.task not in ("contrastive", "rerank"):
            return
        # Evaluated on eval_data's queries, or on held-out rows: each reads its own fields.
        unread = WITHOUT_EVAL_DATA if self.eval_data else WITH_EVAL_DATA
        for name in unread:
            value = getattr(self, name)
            if value != defaults[name]:
                with_data = "without" if self.eval_data else "with"
                raise ValueError(
                    f"{name} applies to task={self.task!r} only {with_data} eval_data, got "
                    f"{name}={value!r} and eval_data={self.eval_data!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> TrainConfig:
        """A config from a mapping; an unknown key is an error naming it (and the likely one)."""
        known = [f.name for f in fields(cls)]
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"{source}: unknown field {key!r}{hint}; known fields: {', '.join(known)}"
                )
        return cls(**data)


def _either(tasks: tuple[str, ...]) -> str:
    """('a', 'b', 'c') -> "'a', 'b' or 'c'"."""
    names = [repr(t) for t in tasks]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _check_type(name: str, value: Any, annotation: str) -> None:
    """The annotation's type, exactly: a TOML ``lr = 1`` is fine (an int is a float), a
    ``steps = 1.5`` or ``checkpointing = "yes"`` is not."""
    if annotation == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool (true or false), got {value!r}")
    elif annotation == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise ArgumentTypeError(f"{name} must be an int, got {value!r}")
    elif annotation == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, got {value!r}")
    elif annotation == "str" and not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {value!r}")


def _check_range(
    name: str,
    value: float,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    # Without an upper end an infinity passes the comparisons (a NaN fails them): lr=inf
    # would train a model of NaN weights to the end.
    ok = math.isfinite(value) and (value > low if low_open else value >= low)
    if high is not None:
        ok = ok and (value < high if high_open else value <= high)
    if not ok:
        expected = (
            f"a number in {left}{low}, {high}{right}"
            if high is not None
            else f"a finite number {'>' if low_open else '>='} {low}"
        )
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def resolve_mode(mode: str, metric: str) -> str:
    """The config's mode, or the metric's own direction when it says none (``""``): a lower
    loss or perplexity is better, a higher accuracy or macro-F1."""
    return mode or ("min" if metric in LOWER_IS_BETTER else "max")


def check_model_files(config: TrainConfig) -> None:
    """The models a run loads only later, checked before any data is read: ``retriever``,
    the first stage of a rerank evaluation, is loaded at the first evaluation, after the run
    folder is begun. Its directory must hold a checkpoint's files (its weights are read then)."""
    if config.task != "rerank" or not config.eval_data or config.retriever == "bundled":
        return
    from ..interop.hf.files import find_checkpoint

    try:
        find_checkpoint(config.retriever)
    except (OSError, ValueError) as exc:  # no such directory; a file; a folder of other files
        raise ValueError(
            f"retriever must be a model directory, got {config.retriever!r} ({exc})"
        ) from None


def check_against_data(config: TrainConfig, train_size: int) -> None:
    """What the config can only be checked against once the data is loaded."""
    if config.batch_size > train_size:
        raise ValueError(
            f"batch_size must be at most the training set's size ({train_size} examples), "
            f"got {config.batch_size}"
        )


def changed_fields(old: dict[str, Any], new: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """Fields whose value differs between a checkpoint's config and this one. A field the
    checkpoint's config lacks (one added since it was written) had its default then."""
    now = new.to_dict()
    then = {f.name: f.default for f in fields(TrainConfig)} | old
    return {k: (then[k], v) for k, v in now.items() if then[k] != v}

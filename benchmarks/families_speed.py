"""Qwen3-Embedding-0.6B and EmbeddingGemma-300m shapes on clearformer against sentence-transformers.

Two random-weight sentence-transformers directories at the real models' widths and depths are
written to a temporary directory (nothing downloaded), and both libraries encode the same corpus
from them: ``SentenceTransformer(dir).encode`` and clearformer's
``TextEncoder.from_pretrained(dir).encode``, each as a user calls it (its own batching).

``qwen3``  Qwen3-Embedding-0.6B: ``Qwen3Model``, 28 layers, hidden 1024, 16 query heads, 8
           key/value heads, head_dim 128 (the attention is 2048 wide), intermediate 3072
           (SwiGLU), rope_theta 1,000,000, RMSNorm eps 1e-6, per-head q/k norms, causal;
           Pooling last token -> Normalize; the query prompt of its
           config_sentence_transformers.json; the tokenizer pads on the left, as Qwen's does.
``gemma``  EmbeddingGemma-300m: ``Gemma3TextModel`` (gemma3_text), 24 layers, hidden 768,
           3 query heads, 1 key/value head, head_dim 256, query_pre_attn_scalar 256,
           intermediate 1152 (GeGLU, gelu_pytorch_tanh), sliding_window 512 with every sixth
           layer global (layers 6, 12, 18, 24), rope_theta 1,000,000 global and 10,000 local,
           RMSNorm eps 1e-6, use_bidirectional_attention; Pooling mean -> Dense 768->3072 ->
           Dense 3072->768 (no bias, Identity) -> Normalize; its query and document prompts.

Where the numbers come from: the two models' published config.json, config_sentence_transformers
.json and modules.json (Qwen/Qwen3-Embedding-0.6B, google/embeddinggemma-300m), written here from
those files as published, since nothing is downloaded. Checked against transformers 5.25 in
site-packages where it has them: ``Gemma3TextConfig``'s defaults give head_dim 256,
query_pre_attn_scalar 256, rms_norm_eps 1e-6, hidden_activation gelu_pytorch_tanh, the rotary
bases 1,000,000 (global) and 10,000 (local) and the layer pattern (``sliding_window_pattern``
6: every sixth layer full attention); with use_bidirectional_attention it turns the saved
sliding_window 512 into an exclusive bound of 257 and saves 512 back. ``Qwen3Config``'s
defaults (Qwen3-8B's) give head_dim 128, rms_norm_eps 1e-6 and SiLU; the widths, depths, head
counts and rope_theta of the 0.6B model are not defaults anywhere in site-packages and come
from its config.json only.

The vocabulary is the bundled all-MiniLM-L6-v2 WordPiece tokenizer's 30,522 pieces, not the
real 151,669 (Qwen3) or 262,144 (Gemma): the embedding table is one row lookup per token, so
its size does not change the encoder's time, and a small one keeps memory sane (the real tables
alone would be 0.6 GB and 0.8 GB in float32 per copy). Its ``[SEP]`` stands for Qwen's
``<|endoftext|>`` appended to every text (the token the last-token pooling reads) and
``[CLS] ... [SEP]`` for Gemma's ``<bos> ... <eos>``. The corpus is encode_throughput's
``sentences`` (word counts log-normal around 16, 3 to 80 words, whole words of that
vocabulary). The weights are transformers' random initialisation (seeded), so the cosines say
how closely the two libraries compute the same function, not how a trained model's
embeddings move in bfloat16.

Rows, per model: each library in float32, and for every ``--precision`` asked:
``bf16``: clearformer ``encode(precision="bf16")`` against sentence-transformers with
``model.to(torch.bfloat16)`` (the fair counterpart); ``auto``: clearformer
``precision="auto"`` (what it takes on this CPU, named in the result) against
sentence-transformers in the same dtype when auto takes bf16, else in float32. All
configurations of one model take turns in one process, under the same allocator setting, in
a rotating order; texts/s is the median over ``--repeats`` turns. Reported: texts/s, the ratio
to sentence-transformers at the same precision, and the min and mean cosine of each row's
embeddings to sentence-transformers float32.

Run: ``python benchmarks/families_speed.py [--models qwen3,gemma] [--precision bf16 auto]
[--texts 1000] [--repeats 3] [--out benchmarks/results/families-speed]``; a quick check:
``--layers 2 --texts 32 --repeats 1``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch  # noqa: E402

MODELS = ("qwen3", "gemma")
PRECISIONS = ("float32", "bf16", "auto")
REFERENCE = "sentence-transformers"

QWEN3 = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    tie_word_embeddings=True,
)
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the "
    "query\nQuery:",
    "document": "",
}
GEMMA = dict(
    hidden_size=768,
    intermediate_size=1152,
    num_hidden_layers=24,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=256,
    query_pre_attn_scalar=256,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    sliding_window=512,
    use_bidirectional_attention=True,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
)
GEMMA_PATTERN = 6  # sliding_window_pattern: layers 6, 12, 18, 24 (1-based) are global
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}
GEMMA_DENSE = ((768, 3072), (3072, 768))


def write_tokenizer(directory: Path, template: str, padding_side: str, source=None) -> int:
    """A WordPiece tokenizer with ``template`` as its special tokens, written to ``directory``:
    ``source`` (a ``tokenizers.Tokenizer`` with BERT's special tokens), else the bundled
    MiniLM's. Returns the vocabulary size."""
    from tokenizers import Tokenizer, processors

    from clearformer.interop.hf import bundled_model_dir

    tok = source or Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    specials = [t for t in ("[CLS]", "[SEP]") if t in template]
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, tok.token_to_id(t)) for t in specials]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "bos_token": "[CLS]",
        "eos_token": "[SEP]",
        "padding_side": padding_side,
        "model_max_length": 512,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()


def write_model(name: str, out: Path, layers: int | None, tokenizer=None) -> Path:
    """The sentence-transformers directory of model ``name`` at ``out`` (random weights, seeded;
    the first ``layers`` layers when given; ``tokenizer``: :func:`write_tokenizer`'s
    ``source``), written by transformers and sentence-transformers themselves."""
    import sentence_transformers as st
    import transformers
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    base = out.parent / f"{name}-base"
    base.mkdir()
    torch.manual_seed(0)
    if name == "qwen3":
        vocab = write_tokenizer(base, "$A [SEP]", padding_side="left", source=tokenizer)
        depth = min(layers or QWEN3["num_hidden_layers"], QWEN3["num_hidden_layers"])
        config = transformers.Qwen3Config(
            **{**QWEN3, "num_hidden_layers": depth}, vocab_size=vocab, pad_token_id=0
        )
        transformers.Qwen3Model(config).save_pretrained(base)
    else:
        vocab = write_tokenizer(base, "[CLS] $A [SEP]", padding_side="right", source=tokenizer)
        full = GEMMA["num_hidden_layers"]
        kinds = [
            "full_attention" if (i + 1) % GEMMA_PATTERN == 0 else "sliding_attention"
            for i in range(full)
        ]
        depth = min(layers or full, full)
        config = transformers.Gemma3TextConfig(
            **{**GEMMA, "num_hidden_layers": depth},
            layer_types=kinds[:depth],
            vocab_size=vocab,
            pad_token_id=0,
        )
        transformers.Gemma3TextModel(config).save_pretrained(base)
    gc.collect()
    transformer = Transformer(str(base))
    width = transformer.get_embedding_dimension()
    if name == "qwen3":
        modules = [transformer, Pooling(width, pooling_mode="lasttoken"), Normalize()]
        prompts = QWEN3_PROMPTS
    else:
        dense = [
            Dense(i, o, bias=False, activation_function=torch.nn.Identity()) for i, o in GEMMA_DENSE
        ]
        modules = [transformer, Pooling(width, pooling_mode="mean"), *dense, Normalize()]
        prompts = GEMMA_PROMPTS
    model = st.SentenceTransformer(modules=modules, prompts=prompts, device="cpu")
    model.save(str(out))
    del model, modules, transformer
    shutil.rmtree(base)
    gc.collect()
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Min and mean row-wise cosine of two embedding matrices."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    c = (a * b).sum(axis=1)
    return {"min": float(c.min()), "mean": float(c.mean())}


def runners(directory: Path, precisions: list[str], prompt_name: str | None):
    """The configurations timed for one model: name -> (encode function, the name of the
    sentence-transformers row at the same precision). Returns them and auto's decision."""
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder

    theirs = SentenceTransformer(str(directory), device="cpu")
    ours = TextEncoder.from_pretrained(directory)

    def st_run(model):
        return lambda texts: np.asarray(
            model.encode(texts, prompt_name=prompt_name, show_progress_bar=False),
            dtype=np.float32,
        )

    def cf_run(precision):
        return lambda texts: ours.encode(
            texts, progress=False, prompt_name=prompt_name, precision=precision
        )

    out = {
        f"{REFERENCE} float32": (st_run(theirs), f"{REFERENCE} float32"),
        "clearformer float32": (cf_run("float32"), f"{REFERENCE} float32"),
    }
    auto = ours.precision_for("auto") if "auto" in precisions else None
    bf16 = "bf16" in precisions or (auto is not None and auto.choice == "bf16")
    if bf16:
        theirs_bf16 = SentenceTransformer(str(directory), device="cpu").to(torch.bfloat16)
        out[f"{REFERENCE} bf16"] = (st_run(theirs_bf16), f"{REFERENCE} bf16")
    if "bf16" in precisions:
        out["clearformer bf16"] = (cf_run("bf16"), f"{REFERENCE} bf16")
    if auto is not None:
        twin = f"{REFERENCE} bf16" if auto.choice == "bf16" else f"{REFERENCE} float32"
        out[f"clearformer auto ({auto.choice})"] = (cf_run("auto"), twin)
    return out, auto


def measure(name: str, directory: Path, texts: list[str], warm: list[str], args) -> dict:
    """Every configuration of one model in turns; medians, ratios and cosines."""
    configs, auto = runners(directory, args.precision, args.prompt_name)
    for run, _ in configs.values():
        run(warm)  # lazy initialisation, the bf16 copy, auto's decision: before any timing
    times: dict[str, list[float]] = {k: [] for k in configs}
    embeddings: dict[str, np.ndarray] = {}
    order = list(configs)
    for repeat in range(args.repeats):
        shift = repeat % len(order)  # rotate: no configuration always runs first
        for key in order[shift:] + order[:shift]:
            start = time.perf_counter()
            got = configs[key][0](texts)
            times[key].append(time.perf_counter() - start)
            embeddings.setdefault(key, got)
    rate = {k: len(texts) / statistics.median(v) for k, v in times.items()}
    rows = []
    for key, (_, twin) in configs.items():
        rows.append(
            {
                "config": key,
                "texts_per_s": rate[key],
                "ratio": rate[key] / rate[twin],
                "vs": twin,
                "seconds": times[key],
                "cosine_to_reference_float32": cosines(
                    embeddings[key], embeddings[f"{REFERENCE} float32"]
                ),
            }
        )
    del configs
    gc.collect()
    return {"model": name, "auto": None if auto is None else str(auto), "rows": rows}


def report_text(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# Qwen3-Embedding-0.6B and EmbeddingGemma-300m shapes: clearformer vs "
        "sentence-transformers",
        "",
        f"Random weights at the real widths ({env['layers']}); {env['texts']} `sentences` texts, "
        f"prompt {env['prompt_name']!r}; torch {env['torch']}, sentence-transformers "
        f"{env['sentence_transformers']}, {env['threads']} threads; medians of "
        f"{env['repeats']} turns.",
        "",
        f"Machine: {env['load_verdict']}",
        "",
    ]
    for run in result["runs"]:
        lines += [f"## {run['model']}", ""]
        if run["auto"] is not None:
            lines += [f"auto: {run['auto']}", ""]
        lines += [
            "| configuration | texts/s | ratio (vs) | cosine to ST float32 min / mean |",
            "| --- | ---: | ---: | ---: |",
        ]
        for r in run["rows"]:
            c = r["cosine_to_reference_float32"]
            lines.append(
                f"| {r['config']} | {r['texts_per_s']:,.1f} | {r['ratio']:.2f}x ({r['vs']}) "
                f"| {c['min']:.6f} / {c['mean']:.6f} |"
            )
        lines.append("")
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help="comma-separated models to build and time, of: qwen3 (Qwen3-Embedding-0.6B "
        "shape), gemma (EmbeddingGemma-300m shape) (default %(default)s)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=PRECISIONS,
        default=["bf16", "auto"],
        help="precisions timed besides float32, which always runs (every cosine is against "
        "sentence-transformers float32): bf16 (clearformer precision='bf16' vs "
        "sentence-transformers model.to(torch.bfloat16)), auto (clearformer precision='auto', "
        "against sentence-transformers in the dtype auto takes) (default: %(default)s)",
    )
    parser.add_argument(
        "--layers",
        type=positive,
        default=None,
        help="build only the first N layers of each model, for a quick run (default: the real "
        "depths, 28 and 24)",
    )
    parser.add_argument(
        "--texts",
        type=positive,
        default=1000,
        help="texts in the corpus (encode_throughput's 'sentences') (default %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=positive,
        default=3,
        help="turns of every configuration; medians reported (default %(default)s)",
    )
    parser.add_argument(
        "--prompt-name",
        default=None,
        choices=("query", "document"),
        help="encode with this named prompt of the directories' config_sentence_transformers"
        ".json, in both libraries (default: none, documents as they are)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write OUT.json and OUT.md (default: print only)",
    )
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if not models or unknown:
        parser.error(f"--models: expected a comma-separated list of {MODELS}, got {args.models!r}")
    args.models = list(dict.fromkeys(models))
    args.precision = [p for p in dict.fromkeys(args.precision) if p != "float32"]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description

    meter = LoadMeter(threads=torch.get_num_threads()).start()
    from clearformer.runtime import retain_freed_memory

    retained = retain_freed_memory()  # before any large allocation, for both libraries alike
    import sentence_transformers

    from clearformer.text.encoder import attention_kernel_for
    from encode_throughput import make_corpus

    # What encode does for a large call, before timing (as encode_throughput does): build the
    # AVX-512 kernels where they can be and measure them where this CPU has no verdict yet.
    attention_kernel_for(10**9, torch.device("cpu"))
    texts = make_corpus(args.texts, "sentences")
    warm = make_corpus(16, "sentences", seed=1)
    runs = []
    with tempfile.TemporaryDirectory(prefix="families-speed-") as tmp:
        for name in args.models:
            print(f"building the {name} directory", flush=True)
            directory = write_model(name, Path(tmp) / name, args.layers)
            run = measure(name, directory, texts, warm, args)
            runs.append(run)
            for r in run["rows"]:
                c = r["cosine_to_reference_float32"]
                print(
                    f"  {name} {r['config']:>36}: {r['texts_per_s']:9,.1f} texts/s  "
                    f"{r['ratio']:.2f}x vs {r['vs']}  cosine to ST float32 min {c['min']:.6f} "
                    f"mean {c['mean']:.6f}",
                    flush=True,
                )
            shutil.rmtree(directory)
    load = meter.record()
    depth = "real depths" if args.layers is None else f"first {args.layers} layers"
    result = {
        "environment": {
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "threads": torch.get_num_threads(),
            "retained": retained,
            "repeats": args.repeats,
            "texts": args.texts,
            "layers": depth,
            "prompt_name": args.prompt_name,
            "precision": args.precision,
            "load": load.to_dict(),
            "load_verdict": load.describe(),
            "cpu": cpu_description(),
        },
        "runs": runs,
    }
    text = report_text(result)
    print(text)
    if args.out is not None:
        from clearformer.io import atomic_write

        with atomic_write(args.out.with_suffix(".json"), "w") as handle:
            json.dump(result, handle, indent=1)
        with atomic_write(args.out.with_suffix(".md"), "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

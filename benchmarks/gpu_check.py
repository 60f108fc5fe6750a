"""The CUDA path in one prepared run: the CUDA and agreement tests on the device, encode
throughput against sentence-transformers on the same device, and a bf16 training step's
tokens/s and model FLOPs utilisation. Results as JSON and markdown in ``--out`` (``$OUT`` on the
device machine).

Sections (each timed and recorded even when another fails):

* ``tests``: ``pytest tests/test_cuda.py tests/test_agreement.py`` with
  ``CLEARFORMER_TEST_DEVICE`` set to the device; the summary line and the exit status.
* ``encode``: a MiniLM-shaped and a Qwen3-Embedding-0.6B-shaped model (random weights and a
  WordPiece vocabulary trained here on the test sentences, so nothing but transformers,
  sentence-transformers and tokenizers is needed on the device machine; written as
  sentence-transformers directories, Qwen3's by ``families_speed.write_model``) on ragged
  sentences: clearformer's ``TextEncoder(device=...)`` against
  ``SentenceTransformer(..., device=...)``, float32 and bf16 (sentence-transformers' bf16:
  ``model.to(torch.bfloat16)``): texts/s, the ratio, the smallest cosine of each row to
  sentence-transformers float32, peak device memory.
* ``train``: a classification fine-tuning step (``TextClassifier``) of each model in bf16
  autocast, packed ragged batches: tokens/s, and model FLOPs utilisation against
  ``--peak-tflops`` (default: the card's dense bf16 peak where the name is known, H100/H200
  989 TFLOP/s): 6 x the non-embedding parameters per token plus attention's 12 x layers x
  width x length.

Run on the device machine: ``python benchmarks/gpu_check.py --out "$OUT"``; try it here with
``python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu-check`` (small sizes, the
same code paths). A section that fails records its error and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The working tree as it is, installed or not (the device machine runs a copy of it).
sys.path[:0] = [str(ROOT / "src"), str(HERE)]

from clearformer.io import write_text_atomically  # noqa: E402

PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # dense bf16 TFLOP/s


def run_tests(device: str, quick: bool) -> dict:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "tests/test_cuda.py",
        "tests/test_agreement.py",
    ]
    if quick:
        command += ["-x", "-k", "float32"]
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "CLEARFORMER_TEST_DEVICE": device, "PYTHONPATH": path}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {
        "returncode": done.returncode,
        "summary": lines[-1] if lines else done.stderr[-500:],
        "seconds": time.perf_counter() - started,
    }


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_mib(device: str) -> float | None:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return None


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def timed(call, device: str, repeats: int) -> float:
    """The median of ``repeats`` timed calls after one untimed one."""
    call()
    synchronize(device)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def trained_wordpiece():
    """A WordPiece tokenizer (BERT's normaliser and special tokens) trained on sentences of the
    test corpus: the bundled model's files are not on the device machine."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from serve_load import make_sentences

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=8000, special_tokens=specials)
    tok.train_from_iterator(make_sentences(4000, 3), trainer)
    return tok


def write_minilm(out: Path, tokenizer) -> Path:
    """A sentence-transformers directory of all-MiniLM-L6-v2's shape (6 layers of 384, 12
    heads, mean pooling, normalised), random weights."""
    import sentence_transformers as st
    import torch
    import transformers
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from families_speed import write_tokenizer

    base = out.parent / "minilm-base"
    base.mkdir()
    vocab = write_tokenizer(base, "[CLS] $A [SEP]", padding_side="right", source=tokenizer)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    transformers.BertModel(config).save_pretrained(base)
    transformer = Transformer(str(base))
    width = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(width, pooling_mode="mean"), Normalize()]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


def models(work: Path, quick: bool) -> dict[str, Path]:
    from families_speed import write_model

    tokenizer = trained_wordpiece()
    return {
        "minilm": write_minilm(work / "minilm", tokenizer),
        "qwen3": write_model("qwen3", work / "qwen3", 1 if quick else None, tokenizer),
    }


def encode_section(name, path, texts, device, repeats) -> list[dict]:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder

    directory = str(path)
    rows = []
    theirs = SentenceTransformer(directory, device=device)
    reference = theirs.encode(texts, batch_size=32, normalize_embeddings=True)
    for precision in ("float32", "bf16"):
        ours = TextEncoder.from_pretrained(path, precision=precision, device=device)
        peer = SentenceTransformer(directory, device=device)
        if precision == "bf16":
            peer.to(torch.bfloat16)
        reset_peak(device)
        our_seconds = timed(lambda o=ours: o.encode(texts, batch_size=32), device, repeats)
        our_peak = peak_mib(device)
        reset_peak(device)
        their_seconds = timed(
            lambda p=peer: p.encode(texts, batch_size=32, normalize_embeddings=True),
            device,
            repeats,
        )
        their_peak = peak_mib(device)
        vectors = np.asarray(ours.encode(texts, batch_size=32), dtype=np.float64)
        cosine = (vectors * reference).sum(1) / (
            np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
        )
        rows.append(
            {
                "model": name,
                "precision": precision,
                "clearformer_texts_per_s": len(texts) / our_seconds,
                "st_texts_per_s": len(texts) / their_seconds,
                "ratio": their_seconds / our_seconds,
                "min_cosine_to_st_float32": float(cosine.min()),
                "peak_mib": [our_peak, their_peak],
            }
        )
        del ours, peer
    return rows


def train_section(name, path, texts, device, repeats, peak_tflops) -> dict:
    import torch

    from clearformer.interop.hf.loading import load_model
    from clearformer.text import TextEncoder
    from clearformer.train.collate import pack_sequences
    from clearformer.train.models import TextClassifier

    tokenizer = TextEncoder.from_pretrained(path).tokenizer
    encodings = tokenizer.encode(texts[:32])
    sequences = [list(e.ids) for e in encodings]
    tokens = sum(len(s) for s in sequences)
    batch = pack_sequences(sequences, [i % 4 for i in range(len(sequences))]).to(device)
    loaded = load_model(path)
    model = TextClassifier(loaded.model, 4, "mean", 0.1).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
            logits = model(batch)
        loss = torch.nn.functional.cross_entropy(logits.float(), batch.labels)
        loss.backward()
        optimizer.step()

    reset_peak(device)
    seconds = timed(step, device, repeats)
    config = loaded.model.config
    embedding = sum(
        p.numel() for n, p in loaded.model.named_parameters() if "embed" in n or "word" in n
    )
    body = sum(p.numel() for p in loaded.model.parameters()) - embedding
    lengths = [len(s) for s in sequences]
    attention = 12 * config.n_layers * config.d_model * sum(x * x for x in lengths) / tokens
    flops = (6 * body + attention) * tokens
    achieved = flops / seconds / 1e12
    return {
        "model": name,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / seconds,
        "achieved_tflops": achieved,
        "mfu": None if not peak_tflops else achieved / peak_tflops,
        "peak_mib": peak_mib(device),
    }


def markdown(report: dict) -> str:
    lines = [f"# CUDA check on {report['device_name']}", "", f"tests: {report['tests']}", ""]
    lines += [f"precision='auto' takes: {report.get('auto')}", ""]
    lines += [
        "| model | precision | clearformer texts/s | ST texts/s | ratio | min cosine | peak MiB |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in report.get("encode", []):
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['clearformer_texts_per_s']:.1f} | "
            f"{row['st_texts_per_s']:.1f} | {row['ratio']:.2f}x | "
            f"{row['min_cosine_to_st_float32']:.5f} | {row['peak_mib']} |"
        )
    lines += [
        "",
        "| model | tokens/s (bf16 step) | TFLOP/s | MFU | peak MiB |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for row in report.get("train", []):
        mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
        lines.append(
            f"| {row['model']} | {row['tokens_per_s']:.0f} | {row['achieved_tflops']:.1f} | "
            f"{mfu} | {row['peak_mib']} |"
        )
    for section, error in report.get("errors", {}).items():
        lines += ["", f"**{section} failed:**", "```", error[-2000:], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"))
    parser.add_argument("--quick", action="store_true", help="small sizes: try the script")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None)
    args = parser.parse_args()
    import torch

    from serve_load import make_sentences

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAKS.items() if k in name), None)
    count = 64 if args.quick else args.texts
    texts = make_sentences(count, 7)
    report: dict = {"device": args.device, "device_name": name, "errors": {}}
    from clearformer.precision import choose_precision

    auto = choose_precision("auto", device=args.device)
    report["auto"] = f"{auto.choice} ({auto.reason})"  # what precision="auto" takes there
    report["tests"] = run_tests(args.device, args.quick)
    report["encode"], report["train"] = [], []
    with tempfile.TemporaryDirectory() as scratch:
        try:
            chosen = models(Path(scratch), args.quick)
        except Exception:  # the run goes on: record why
            report["errors"]["models"] = traceback.format_exc()
            chosen = {}
        for model, path in chosen.items():
            for section, call in (
                (
                    "encode",
                    lambda m=model, p=path: encode_section(m, p, texts, args.device, args.repeats),
                ),
                (
                    "train",
                    lambda m=model, p=path: train_section(
                        m, p, texts, args.device, args.repeats, peak
                    ),
                ),
            ):
                try:
                    result = call()
                    report[section] += result if isinstance(result, list) else [result]
                except Exception:
                    report["errors"][f"{section} {model}"] = traceback.format_exc()
                write_text_atomically((out / "gpu-check.json"), json.dumps(report, indent=1) + "\n")
                write_text_atomically((out / "gpu-check.md"), markdown(report))
    print(markdown(report))
    return 0 if not report["errors"] and report["tests"]["returncode"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

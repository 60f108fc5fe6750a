"""ModernBERT on clearformer against transformers' ModernBertModel: rotary positions, local and
global layers, GeGLU, on every backend, packed and padded, from small random checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clearformer import EncoderModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

LENGTHS = [40, 7, 33, 1, 0]  # a window of 8 is far smaller than the longest sequence
T = max(LENGTHS)


def hf_config(**overrides):
    base = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=5,  # layers 0 and 3 global, 1, 2 and 4 local
        num_attention_heads=4,
        local_attention=8,
        global_attn_every_n_layers=3,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        global_rope_theta=160_000.0,
        local_rope_theta=10_000.0,
    )
    base.update(overrides)
    return transformers.ModernBertConfig(**base)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random ModernBERT written by transformers, with non-trivial norms."""
    torch.manual_seed(0)
    model = transformers.ModernBertModel(hf_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("modernbert")
    model.save_pretrained(path)
    return path, model


def load(path, backend="auto"):
    from clearformer.interop.hf.loading import load_model

    vocab = path / "vocab.txt"  # a checkpoint directory holds a tokenizer; these tests need ids
    if not vocab.exists():
        vocab.write_text(
            "\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]"] + [f"w{i}" for i in range(93)])
        )
    return load_model(path, backend=backend).model.eval()


def batch():
    torch.manual_seed(1)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    ids = torch.randint(3, 97, (len(LENGTHS), T)).masked_fill(~mask, 0)
    return ids, mask


def reference(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
    return out.last_hidden_state, out.hidden_states


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen"])
def test_matches_transformers_on_every_backend(checkpoint, backend):
    path, hf = checkpoint
    ours = load(path, backend)
    cfg = ours.config
    assert cfg.layer_types == ("global", "local", "local", "global", "local")
    assert cfg.positions == "rotary" and cfg.activation == "geglu" and not cfg.first_attn_norm
    ids, mask = batch()
    want, want_hidden = reference(hf, ids, mask)
    with torch.no_grad():
        got = ours(ids, mask, output_hidden_states=True)
    assert ours.encoder.plan_for(mask).packed == (backend in ("auto", "varlen"))
    assert torch.isfinite(got.last_hidden_state).all()
    real = mask.bool()
    torch.testing.assert_close(got.last_hidden_state[real], want[real], atol=1e-5, rtol=0)
    assert (got.last_hidden_state[~real] == 0).all()
    # every layer's output (transformers' last entry is after the final norm)
    for layer in range(1, cfg.n_layers):
        torch.testing.assert_close(
            got.hidden_states[layer][real], want_hidden[layer][real], atol=1e-5, rtol=0
        )


def test_packed_equals_padded_equals_each_sequence_alone(checkpoint):
    path, _ = checkpoint
    packed, padded = load(path, "varlen"), load(path, "sdpa")
    ids, mask = batch()
    with torch.no_grad():
        a, b = packed(ids, mask), padded(ids, mask)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        for i, n in enumerate(LENGTHS):
            if n:
                alone = padded(ids[i : i + 1, :n])
                torch.testing.assert_close(alone[0], a[i, :n], atol=1e-5, rtol=0)


def test_pads_far_from_any_real_token_stay_finite_and_zero(checkpoint):
    """A pad query beyond the half-window of every real token has no key in local layers."""
    path, _ = checkpoint
    model = load(path, "math")
    ids, mask = batch()
    with torch.no_grad():
        out = model(ids, mask, output_hidden_states=True, output_attentions=True)
    for hidden in out.hidden_states:
        assert torch.isfinite(hidden).all() and (hidden[~mask] == 0).all()
    for weights in out.attentions:
        assert torch.isfinite(weights).all()
    # the local layers really are local: a real query gives zero weight beyond the window
    local = out.attentions[1]  # (B, H, T, T)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    assert (local[:, :, (i - j).abs() > 4] == 0).all()
    assert (local[0][:, (i - j).abs() <= 4] > 0).any()


@pytest.mark.parametrize("half_window", [3, 5])
def test_a_window_off_by_one_fails_the_tolerance(checkpoint, tmp_path, half_window):
    """Negative control: the same weights with local_attention // 2 = 3 or 5 instead of 4."""
    path, hf = checkpoint
    config = json.loads((path / "config.json").read_text())
    config["local_attention"] = 2 * half_window
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    wrong = load(tmp_path, "sdpa")
    ids, mask = batch()
    want, _ = reference(hf, ids, mask)
    with torch.no_grad():
        got = wrong(ids, mask)
    assert (got[mask] - want[mask]).abs().max() > 1e-3


def test_legacy_and_v5_config_spellings_give_the_same_model(checkpoint, tmp_path):
    from clearformer.interop.hf.families import family_for

    path, _ = checkpoint
    v5 = json.loads((path / "config.json").read_text())
    assert "layer_types" in v5 and "rope_parameters" in v5  # as transformers 5 writes it
    legacy = {k: v for k, v in v5.items() if k not in ("layer_types", "rope_parameters")} | {
        "global_attn_every_n_layers": 3,
        "global_rope_theta": 160_000.0,
        "local_rope_theta": 1e4,
    }
    family = family_for(v5)
    assert family.encoder_config(v5) == family.encoder_config(legacy)


def test_save_and_reload_through_transformers(checkpoint, tmp_path):
    from clearformer.interop.hf.loading import save_model

    path, hf = checkpoint
    ours = load(path)
    save_model(ours, tmp_path, "modernbert")
    again = transformers.ModernBertModel.from_pretrained(tmp_path).eval()
    ids, mask = batch()
    want, _ = reference(hf, ids, mask)
    got, _ = reference(again, ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-6, rtol=0)


def test_model_prefix_of_a_masked_lm_checkpoint_loads(tmp_path):
    torch.manual_seed(2)
    mlm = transformers.ModernBertForMaskedLM(hf_config()).eval()
    mlm.save_pretrained(tmp_path)
    ours = load(tmp_path)
    ids, mask = batch()
    want, _ = reference(mlm.model, ids, mask)
    with torch.no_grad():
        got = ours(ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


def test_unsupported_configs_name_the_field():
    from clearformer.interop.hf.families import family_for
    from clearformer.interop.hf.files import CheckpointError

    good = hf_config().to_dict()
    for change, field in [
        ({"hidden_activation": "silu"}, "hidden_activation"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_scaling"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"layer_types": ["sliding_attention"] * 5}, "layer_types"),
    ]:
        with pytest.raises(CheckpointError, match=field):
            family_for(good).encoder_config({**good, **change})


def test_a_standalone_clearformer_model_with_the_same_config_runs():
    """The family's config is an ordinary EncoderConfig: a model can be built from it."""
    from clearformer.interop.hf.families import family_for

    config = family_for(hf_config().to_dict()).encoder_config(hf_config().to_dict())
    model = EncoderModel(config).eval()
    ids, mask = batch()
    with torch.no_grad():
        assert model(ids, mask).shape == (len(LENGTHS), T, 32)


def test_long_rows_through_the_slab_kernel_match_transformers(tmp_path):
    """T = 600 > the slab threshold: padded sdpa and packed rows attend slab by slab."""
    torch.manual_seed(3)
    hf = transformers.ModernBertModel(
        hf_config(max_position_embeddings=1024, global_rope_theta=50_000.0, local_rope_theta=5e3)
    ).eval()
    hf.save_pretrained(tmp_path)
    lengths = [600, 230, 1]
    mask = torch.arange(600)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.randint(3, 97, (3, 600)).masked_fill(~mask, 0)
    want, _ = reference(hf, ids, mask)
    for backend in ("sdpa", "varlen", "math"):
        model = load(tmp_path, backend)
        assert model.config.rope_theta == 50_000.0 and model.config.local_rope_theta == 5e3
        with torch.no_grad():
            got = model(ids, mask)
        torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0, msg=backend)


def test_odd_windows_and_other_periods_round_trip(tmp_path):
    torch.manual_seed(4)
    hf = transformers.ModernBertModel(
        hf_config(local_attention=9, global_attn_every_n_layers=2)
    ).eval()
    hf.save_pretrained(tmp_path / "theirs")
    ours = load(tmp_path / "theirs")
    assert ours.config.local_window == 9 and ours.config.window_of("local") == 4
    assert ours.config.layer_types == ("global", "local", "global", "local", "global")
    from clearformer.interop.hf.loading import save_model

    save_model(ours, tmp_path / "ours", "modernbert")
    again = load(tmp_path / "ours")  # clearformer reads back its own save
    ids, mask = batch()
    want, _ = reference(hf, ids, mask)
    with torch.no_grad():
        got = again(ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_as_close_to_float32_as_transformers(checkpoint, dtype):
    """Rotary tables in float32, rotation cast back: no worse than transformers' own."""
    path, hf = checkpoint
    ids, mask = batch()
    want, _ = reference(hf, ids, mask)
    theirs, _ = reference(transformers.ModernBertModel.from_pretrained(path).to(dtype), ids, mask)
    ours = load(path).to(dtype)
    with torch.no_grad():
        got = ours(ids, mask)
    ours_err = (got.float()[mask] - want[mask]).abs().max()
    theirs_err = (theirs.float()[mask] - want[mask]).abs().max()
    assert ours_err <= 1.5 * theirs_err + 1e-6, (float(ours_err), float(theirs_err))


def test_masked_lm_logits_equal_transformers(tmp_path):
    from clearformer.interop.hf.masked_lm import load_masked_lm

    torch.manual_seed(5)
    mlm = transformers.ModernBertForMaskedLM(hf_config()).eval()
    with torch.no_grad():
        for name, p in mlm.named_parameters():
            if "norm" in name or name.endswith("decoder.bias"):
                p.uniform_(0.5, 1.5)
    mlm.save_pretrained(tmp_path)
    load(tmp_path)  # writes the vocabulary a checkpoint directory needs
    ours = load_masked_lm(tmp_path, backend="varlen")
    assert not ours.loaded.report.missing
    assert "head.bias" in ours.loaded.report.loaded
    ids, mask = batch()
    with torch.no_grad():
        want = mlm(input_ids=ids, attention_mask=mask.long()).logits
        got = ours.logits(ids, mask)
    assert got.shape == want.shape == (len(LENGTHS), T, 97)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-4, rtol=1e-5)


def test_a_base_checkpoint_has_no_masked_lm_head(checkpoint):
    from clearformer.interop.hf.files import CheckpointError
    from clearformer.interop.hf.masked_lm import load_masked_lm

    path, _ = checkpoint
    load(path)
    with pytest.raises(CheckpointError, match="has no masked-LM head"):
        load_masked_lm(path)

"""BERT-family masked-LM heads (``BertForMaskedLM``, ``RobertaForMaskedLM``,
``XLMRobertaForMaskedLM``, ``DistilBertForMaskedLM``) on clearformer against transformers:
logits on every backend on a ragged batch, and save -> ``AutoModelForMaskedLM`` with no missing
key and equal logits, also after the weights change (a trained model), and the refusals."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from clearformer import EncoderModel
from clearformer.heads import MaskedLMConfig, MaskedLMHead

from .helpers import lengths_mask
from .test_pretrained_checkpoints import _perturb, _wordlevel_tokenizer, _wordpiece_vocab

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from clearformer.interop.hf.files import CheckpointError  # noqa: E402
from clearformer.interop.hf.masked_lm import load_masked_lm, save_masked_lm  # noqa: E402

V = 40
LENGTHS = [9, 4, 1, 6]  # ragged: three rows padded, one to a single token
T = max(LENGTHS)
BACKENDS = ["math", "sdpa", "varlen", "auto"]
# (kind, transformers config overrides). A LayerNorm epsilon far from the default (1e-3) makes
# a head that ignored config.json's visibly wrong; the activations are what hidden_act offers.
KINDS = {
    "bert": {"hidden_act": "gelu"},
    "bert-gelu-new": {"hidden_act": "gelu_new"},
    "bert-relu": {"hidden_act": "relu"},
    "roberta": {"hidden_act": "relu"},  # RoBERTa's head is GELU whatever hidden_act says
    "xlm-roberta": {},
    "distilbert": {"activation": "gelu"},
    "mpnet": {"hidden_act": "relu"},  # MPNet's head, as RoBERTa's, is GELU whatever it says
}
MASKED_LM_CLASS = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "xlm-roberta": "XLMRobertaForMaskedLM",
    "distilbert": "DistilBertForMaskedLM",
    "mpnet": "MPNetForMaskedLM",
}


def family_of(kind: str) -> str:
    return kind.split("-gelu")[0].split("-relu")[0]


def make_mlm(kind: str, directory: Path, **extra) -> torch.nn.Module:
    """A small random transformers ``*ForMaskedLM`` saved in ``directory``, with a tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    family = family_of(kind)
    overrides = {**KINDS[kind], **extra}
    sizes = dict(vocab_size=V, num_hidden_layers=2, num_attention_heads=4)
    if family == "distilbert":
        cfg = transformers.DistilBertConfig(
            vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64, **overrides
        )
        model = transformers.DistilBertForMaskedLM(cfg)
        _wordpiece_vocab(directory)
    elif family == "mpnet":
        cfg = transformers.MPNetConfig(
            **sizes,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=T + 2,
            layer_norm_eps=1e-3,
            **overrides,
        )
        model = transformers.MPNetForMaskedLM(cfg)
        _wordpiece_vocab(directory)
    elif family in ("roberta", "xlm-roberta"):
        config_class, model_class = {
            "roberta": (transformers.RobertaConfig, transformers.RobertaForMaskedLM),
            "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM),
        }[family]
        cfg = config_class(
            **sizes,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=T + 2,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,
            layer_norm_eps=1e-3,
            **overrides,
        )
        model = model_class(cfg)
        _wordlevel_tokenizer(directory)
    else:
        cfg = transformers.BertConfig(
            **sizes, hidden_size=32, intermediate_size=64, layer_norm_eps=1e-3, **overrides
        )
        model = transformers.BertForMaskedLM(cfg)
        _wordpiece_vocab(directory)
    _perturb(model, seed=len(kind))  # every parameter off its initial value: head biases too
    model.eval().save_pretrained(str(directory))
    return model


def batch(kind: str):
    """Ragged ids with the family's pad id at padded positions (RoBERTa numbers positions from
    them), and token types where the family has them."""
    gen = torch.Generator().manual_seed(1)
    mask = lengths_mask(LENGTHS, T)
    pad = 1 if family_of(kind) in ("roberta", "xlm-roberta", "mpnet") else 0
    ids = torch.randint(5, V, (len(LENGTHS), T), generator=gen).masked_fill(~mask, pad)
    types = None
    if family_of(kind) == "bert":
        types = torch.randint(0, 2, (len(LENGTHS), T), generator=gen).masked_fill(~mask, 0)
    return ids, mask, types


def reference_logits(model, ids, mask, types) -> torch.Tensor:
    kwargs = {"input_ids": ids, "attention_mask": mask.long()}
    if types is not None:
        kwargs["token_type_ids"] = types
    with torch.no_grad():
        return model(**kwargs).logits


def our_logits(mlm, ids, mask, types) -> torch.Tensor:
    with torch.no_grad():
        return mlm.logits(ids, mask, types) if types is not None else mlm.logits(ids, mask)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}
    for kind in KINDS:
        path = tmp_path_factory.mktemp(kind)
        made[kind] = (path, make_mlm(kind, path))
    return made


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_equal_transformers_on_every_backend(checkpoints, kind, backend):
    path, hf = checkpoints[kind]
    ours = load_masked_lm(path, backend=backend)
    report = ours.loaded.report
    assert report.complete and not report.unused, str(report)
    assert {"head.dense.weight", "head.norm.bias", "head.bias"} <= set(report.loaded)
    ids, mask, types = batch(kind)
    assert ours.loaded.model.encoder.plan_for(mask).packed == (backend in ("auto", "varlen"))
    got, want = our_logits(ours, ids, mask, types), reference_logits(hf, ids, mask, types)
    assert got.shape == want.shape == (len(LENGTHS), T, V)
    assert want[mask].abs().max() > 0.5  # logits large enough for 1e-5 to mean something
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


def test_the_head_takes_its_numerics_from_config_json(checkpoints):
    expected = {
        "bert": ("gelu", 1e-3),
        "bert-gelu-new": ("gelu_new", 1e-3),
        "bert-relu": ("relu", 1e-3),
        "roberta": ("gelu", 1e-3),
        "xlm-roberta": ("gelu", 1e-3),
        "distilbert": ("gelu", 1e-12),
    }
    for kind, (activation, eps) in expected.items():
        config = load_masked_lm(checkpoints[kind][0]).head.config
        assert (config.activation, config.norm_eps) == (activation, eps), kind
        assert config.vocab_size == V and config.d_model == 32


@pytest.mark.parametrize("kind", list(KINDS))
def test_save_loads_in_transformers_with_no_missing_key_and_equal_logits(
    checkpoints, kind, tmp_path
):
    path, hf = checkpoints[kind]
    ours = load_masked_lm(path)
    # A trainer changes every weight, the tied embeddings and the head's bias included.
    _perturb(ours.loaded.model, seed=7)
    _perturb(ours.head, seed=8)
    ids, mask, types = batch(kind)
    trained = our_logits(ours, ids, mask, types)
    assert (trained[mask] - reference_logits(hf, ids, mask, types)[mask]).abs().max() > 1e-2
    out = ours.save_pretrained(tmp_path / "saved")
    saved = json.loads((out / "config.json").read_text())
    assert saved["architectures"] == [MASKED_LM_CLASS[family_of(kind)]]
    keys = set(safetensors_torch.load_file(str(out / "model.safetensors")))
    assert not any(k.endswith("decoder.weight") or k == "vocab_projector.weight" for k in keys)
    again, info = transformers.AutoModelForMaskedLM.from_pretrained(
        str(out), output_loading_info=True
    )
    assert type(again).__name__ == MASKED_LM_CLASS[family_of(kind)]
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"] and not info["error_msgs"], info
    want = reference_logits(again.eval(), ids, mask, types)
    torch.testing.assert_close(trained[mask], want[mask], atol=1e-5, rtol=0)
    # clearformer reads its own save back, tokenizer included.
    assert {p.name for p in path.iterdir() if p.suffix in (".txt", ".json")} <= {
        p.name for p in out.iterdir()
    }
    reread = our_logits(load_masked_lm(out), ids, mask, types)
    torch.testing.assert_close(reread[mask], trained[mask], atol=1e-6, rtol=0)


def test_a_model_and_head_built_from_scratch_save_as_bert_for_masked_lm(checkpoints, tmp_path):
    config = load_masked_lm(checkpoints["bert"][0]).loaded.model.config
    torch.manual_seed(3)
    model, head = EncoderModel(config).eval(), MaskedLMHead(MaskedLMConfig(32, V, norm_eps=1e-3))
    _perturb(head, seed=4)
    out = save_masked_lm(model, head, tmp_path / "scratch", "bert")
    again, info = transformers.AutoModelForMaskedLM.from_pretrained(
        str(out), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask, types = batch("bert")
    with torch.no_grad():
        got = head(model(ids, mask, types), model.embeddings.word.weight)
    want = reference_logits(again.eval(), ids, mask, types)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


def test_a_head_config_json_cannot_express_is_refused_before_writing(checkpoints, tmp_path):
    ours = load_masked_lm(checkpoints["bert"][0])
    for change in ({"activation": "tanh"}, {"norm_eps": 1e-5}, {"decoder_bias": False}):
        config = dataclasses.replace(ours.head.config, **change)
        field = next(iter(change))
        with pytest.raises(CheckpointError, match=rf"has {field}=.*nothing was written"):
            save_masked_lm(ours.loaded.model, MaskedLMHead(config), tmp_path / field, "bert")
        assert not (tmp_path / field).exists()


def test_modernbert_saves_as_modernbert_for_masked_lm(tmp_path):
    from .test_modernbert import hf_config, load

    torch.manual_seed(5)
    mlm = transformers.ModernBertForMaskedLM(hf_config()).eval()
    _perturb(mlm, seed=5)
    mlm.save_pretrained(tmp_path / "theirs")
    load(tmp_path / "theirs")  # writes the vocabulary a checkpoint directory needs
    out = load_masked_lm(tmp_path / "theirs").save_pretrained(tmp_path / "ours")
    again, info = transformers.AutoModelForMaskedLM.from_pretrained(
        str(out), output_loading_info=True
    )
    assert type(again).__name__ == "ModernBertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    mask = lengths_mask([12, 5, 1], 12)
    ids = torch.randint(3, 97, (3, 12)).masked_fill(~mask, 0)
    want = reference_logits(mlm, ids, mask, None)
    torch.testing.assert_close(reference_logits(again.eval(), ids, mask, None), want)


def _rewrite(path: Path, change) -> None:
    """Rewrite the checkpoint's tensors through ``change(tensors) -> tensors``."""
    file = str(path / "model.safetensors")
    tensors = change(dict(safetensors_torch.load_file(file)))
    safetensors_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, file)


def test_stored_tied_copies_are_checked(tmp_path):
    make_mlm("bert", tmp_path)

    def add_copies(t):
        t["cls.predictions.decoder.weight"] = t["bert.embeddings.word_embeddings.weight"].clone()
        t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"].clone()
        return t

    _rewrite(tmp_path, add_copies)  # as older transformers wrote them: equal copies
    report = load_masked_lm(tmp_path).loaded.report
    assert {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} <= set(report.ignored)
    assert not report.unused

    def untie(t):
        t["cls.predictions.decoder.weight"] = t["cls.predictions.decoder.weight"] + 1.0
        return t

    _rewrite(tmp_path, untie)
    with pytest.raises(CheckpointError, match=r"cls.predictions.decoder.weight in .* differs"):
        load_masked_lm(tmp_path)


def test_an_untied_config_is_refused(tmp_path):
    make_mlm("roberta", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match=r"config.json: 'tie_word_embeddings' must be true"):
        load_masked_lm(tmp_path)


def test_tensorflow_names_of_the_head_norm_load(tmp_path):
    hf = make_mlm("bert", tmp_path)

    def rename(t):
        for part in ("weight", "bias"):
            key = f"cls.predictions.transform.LayerNorm.{part}"
            t[key.replace(part, "gamma" if part == "weight" else "beta")] = t.pop(key)
        return t

    _rewrite(tmp_path, rename)
    ids, mask, types = batch("bert")
    got = our_logits(load_masked_lm(tmp_path), ids, mask, types)
    want = reference_logits(hf, ids, mask, types)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


def test_a_missing_head_tensor_and_a_base_model_are_refused(tmp_path):
    make_mlm("distilbert", tmp_path / "mlm")

    def drop_bias(t):
        del t["vocab_projector.bias"]
        return t

    _rewrite(tmp_path / "mlm", drop_bias)
    with pytest.raises(CheckpointError, match=r"lacks tensors of its masked-LM head.*vocab_proj"):
        load_masked_lm(tmp_path / "mlm")
    partial = load_masked_lm(tmp_path / "mlm", strict=False)
    assert partial.loaded.report.missing == ["vocab_projector.bias"]

    base = tmp_path / "base"
    base.mkdir()
    small = dict(num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, **small)
    transformers.BertModel(cfg).save_pretrained(str(base))
    _wordpiece_vocab(base)
    with pytest.raises(CheckpointError, match="has no masked-LM head"):
        load_masked_lm(base)


def test_an_activation_the_head_cannot_run_names_the_field(tmp_path):
    from clearformer.interop.hf.families import family_named

    hf = transformers.BertConfig(vocab_size=V, hidden_size=32, hidden_act="quick_gelu").to_dict()
    with pytest.raises(CheckpointError, match=r"'hidden_act'='quick_gelu' for the masked-LM head"):
        family_named("bert").masked_lm(hf)

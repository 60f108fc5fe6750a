"""``clearformer.pretrained`` keeps every name it offered, as re-exports of where they live."""

from __future__ import annotations

import importlib
import pkgutil

import clearformer
import clearformer.pretrained as pretrained
from clearformer import heads, text
from clearformer.interop import hf

NAMES = {
    "ARCHITECTURES": hf.FAMILIES,
    "POOLING_MODES": heads.POOLING_MODES,
    "Architecture": hf.Family,
    "CheckpointError": hf.CheckpointError,
    "CheckpointFiles": hf.CheckpointFiles,
    "LoadReport": hf.LoadReport,
    "LoadedModel": hf.LoadedModel,
    "TextEncoder": text.TextEncoder,
    "TextTokenizer": hf.TextTokenizer,
    "TokenBatch": hf.TokenBatch,
    "architecture_for": hf.family_for,
    "bundled_model_dir": hf.bundled_model_dir,
    "find_checkpoint": hf.find_checkpoint,
    "load_model": hf.load_model,
    "pool": heads.pool,
    "save_model": hf.save_model,
}


def test_every_name_is_the_one_from_its_new_home():
    assert sorted(pretrained.__all__) == sorted(NAMES)
    for name, value in NAMES.items():
        assert getattr(pretrained, name) is value, name
    assert clearformer.TextEncoder is text.TextEncoder


def test_the_old_names_still_work():
    assert pretrained.ARCHITECTURES["roberta"].hf_class == "RobertaModel"
    assert pretrained.architecture_for({"model_type": "distilbert"}).model_type == "distilbert"
    assert isinstance(pretrained.ARCHITECTURES["bert"], pretrained.Architecture)


def test_pretrained_holds_no_modules_of_its_own():
    assert [m.name for m in pkgutil.iter_modules(pretrained.__path__)] == []
    for module in ("files", "weights", "mapping", "tokenizer", "loading", "bundled"):
        importlib.import_module(f"clearformer.interop.hf.{module}")

"""A sentence-transformers pooling config clearformer cannot follow is refused with an error
that names the file (``1_Pooling/config.json``) and the keys that decide the mode."""

from __future__ import annotations

import json
import re

import pytest

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError

from .helpers import write_tiny_bert
from .index_helpers import WORDS

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = write_tiny_bert(tmp_path_factory.mktemp("pooling") / "ckpt", WORDS)
    (directory / "modules.json").write_text(json.dumps(MODULES))
    (directory / "1_Pooling").mkdir()
    return directory


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (  # every mode switched off: the case that named neither file nor keys
            {"word_embedding_dimension": 16, "pooling_mode_mean_tokens": False},
            "names no pooling mode: none of its keys pooling_mode_cls_token, "
            "pooling_mode_mean_tokens, pooling_mode_max_tokens",
        ),
        (
            {"pooling_mode_bag_tokens": True},
            "(it sets pooling_mode_bag_tokens, which clearformer does not know)",
        ),
        (
            {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True},
            "unsupported pooling ['cls', 'max']: its keys pooling_mode_cls_token, "
            "pooling_mode_max_tokens ask for several modes at once",
        ),
        ({"pooling_mode": "bag"}, "unsupported pooling ['bag']: its 'pooling_mode' asks for"),
    ],
)
def test_a_pooling_config_without_one_known_mode_names_its_file_and_keys(checkpoint, config, says):
    path = checkpoint / "1_Pooling" / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(says)) as refused:
        TextEncoder.from_pretrained(checkpoint)
    assert str(path) in str(refused.value)
    assert "supported: one of" in str(refused.value)


def test_the_cli_says_it_in_one_line(checkpoint, capsys):
    from clearformer.cli import main

    path = checkpoint / "1_Pooling" / "config.json"
    path.write_text(json.dumps({"pooling_mode_mean_tokens": False}))
    assert main(["encode", "a b", "--model", str(checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "pooling_mode_" in err

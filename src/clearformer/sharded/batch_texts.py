"""The texts of one batch a Ray or Spark pipeline hands a worker, checked to be strings."""

from __future__ import annotations

from collections.abc import Iterable


def batch_texts(values: Iterable, column: str | None = None) -> list[str]:
    """``values`` (a batch's column) as a list of str; TypeError naming the row for anything
    else: ``str()`` or ``astype(str)`` would embed a null as "None" and a NaN as "nan", a
    result with no error. ``column``: named in the error where the caller has one."""
    where = "" if column is None else f"column {column!r}: "
    texts = []
    for row, text in enumerate(values):
        if not isinstance(text, str):  # numpy's str_ is a str
            raise TypeError(
                f"{where}row {row} of this batch is {text!r} ({type(text).__name__}), expected "
                "a string; drop or fill the rows without text before embedding"
            )
        texts.append(str(text))
    return texts

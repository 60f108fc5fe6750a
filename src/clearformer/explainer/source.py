"""Find the line of clearformer's source that computed a recorded tensor.

A record call sits right after the statement that computes its tensor, so the line to show is
the statement just before the call (other record calls skipped), or the nearest line above that
contains the step's anchor text. Both are read from the file that ran, so they cannot drift.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

# The directory holding the clearformer package: explainer/source.py -> explainer -> clearformer.
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent
MAX_CODE_LINES = 3


@dataclass(frozen=True)
class Source:
    """Where a step is computed.

    Attributes:
        file: path relative to the directory holding the ``clearformer`` package
            (``clearformer/kernels/math.py``), or the absolute path outside it.
        line: first line of the computing statement (1-based).
        code: its text, dedented, at most ``MAX_CODE_LINES`` lines.
        function: the enclosing function's name.
    """

    file: str
    line: int
    code: str
    function: str

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "code": self.code, "function": self.function}


@functools.lru_cache(maxsize=1024)
def locate(path: str, record_line: int, anchor: str | None = None) -> Source:
    """The statement that computed the tensor recorded at ``path:record_line``."""
    info = _parse(path)
    shown = display_path(path)
    if info is None:
        return Source(shown, record_line, "", "")
    lines, tree = info
    function, body = _enclosing_body(tree, record_line)
    start, end = record_line, record_line
    found = False
    if anchor is not None:
        # Nearest line above in the same function first, then anywhere in the file (a value
        # computed by the caller, such as the norm feeding ``_attend``).
        top = function.lineno if function is not None else record_line
        candidates = [*range(record_line - 1, top - 1, -1), *range(1, len(lines) + 1)]
        for number in candidates:
            if anchor in lines[number - 1] and "record(" not in lines[number - 1]:
                start, end, found = number, number, True
                break
    if not found and body is not None:
        before = [s for s in body if s.end_lineno is not None and s.end_lineno < record_line]
        before = [s for s in before if not _is_record_call(s)]
        if before:
            start, end = before[-1].lineno, before[-1].end_lineno or before[-1].lineno
    code = _snippet(lines, start, end)
    return Source(shown, start, code, function.name if function is not None else "")


def _snippet(lines: list[str], start: int, end: int) -> str:
    chosen = lines[start - 1 : min(end, start + MAX_CODE_LINES - 1)]
    indent = min((len(s) - len(s.lstrip()) for s in chosen if s.strip()), default=0)
    text = [s[indent:].rstrip() for s in chosen]
    if end > start + MAX_CODE_LINES - 1:
        text.append("...")
    return "\n".join(text)


def _is_record_call(stmt: ast.stmt) -> bool:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (
        isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "record"
    )


def _enclosing_body(tree: ast.AST, line: int):
    """The innermost function around ``line`` and the statement list holding that line."""
    function = None
    body = None
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and (function is None or node.lineno > function.lineno)
        ):
            function = node
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            for stmt in stmts:
                if stmt.lineno == line and _is_record_call(stmt):
                    body = stmts
    return function, body


@functools.lru_cache(maxsize=64)
def _parse(path: str) -> tuple[list[str], ast.AST] | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
        return text.splitlines(), ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def display_path(path: str) -> str:
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(_PACKAGE_ROOT).as_posix()
    except ValueError:
        return str(resolved)

"""``add_to_kinds``: more texts into a folder of kinds (:mod:`.collection`), appended to its
texts store and to every kind it holds, so that all kinds keep the same rows.

Exactly once: a text is new unless the texts store already holds it with the same id (with no
ids given, unless it holds the same text; new texts then get their row numbers as ids, as the
dense add gives them), and a text repeated in one add is added once. An add of texts all held
adds nothing and says so.

Every check comes before any work: the texts and ids; each kind's committed sub-index opened
as a search opens it (damage refused, naming the file); a model for every kind that needs one
(bm25 needs none), of that kind and of the identity the kind records (a model of another kind
or identity is refused naming both); the engines the kinds need.

The order of an add, with the folder's and every kind's writer lock held throughout:

1. each kind that holds fewer rows than the texts store will (dense, sparse, multivector, in
   that order) encodes the rows it lacks, in chunks committed one by one under its
   ``staging/``; nothing a reader sees changes;
2. each kind writes its next generation (:mod:`.kind_extend`), under a temporary name then
   renamed: whole, but not current;
3. the texts store takes the new rows: a new database, then ``texts.json`` replaced (its
   commit, :func:`.collection.extend_texts`); it keeps the earlier state's rows and hash, so
   every kind, still at its old rows, opens as before;
4. each kind's ``CURRENT`` is replaced, in the order dense, sparse, multivector, bm25.

The recovery rule: the texts store says what every kind must hold. An add first brings each
kind that holds fewer rows than the store up to it (encoding, in a kind, only the rows that
kind lacks), whether or not it has new texts of its own. So an add killed before step 3 leaves
the folder as it was, and run again reuses every chunk it committed; killed after step 3, it
leaves kinds at the old rows and perhaps some at the new: each still opens on its own (its
rows are a state of the store), :class:`~.hybrid.HybridIndex` refuses to fuse kinds that
disagree (:class:`~.collection.KindsDisagreeError`, naming each kind's rows), and the same add
run again (or any add) finishes the kinds that lag, reusing their chunks, and adds nothing
twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import engine, layout
from .build import add_to_index as add_to_dense_index
from .collection import (
    content_hash,
    extend_texts,
    is_collection,
    kinds_present,
    open_texts,
    remove_stale_texts,
)
from .identity import ModelIdentity, ModelMismatchError
from .inputs import check_ids, check_texts
from .kind_extend import StagedKind, check_add_precision, check_engine, read_state, stage_kind
from .kinds import encoder_for, identity_of, model_kind_of
from .multivector_index import MultiVectorOptions

log = logging.getLogger(__name__)

_MODEL_KINDS = ("dense", "sparse", "multivector")  # the kinds a model encodes (not bm25)


@dataclass(frozen=True)
class KindsAdded:
    """What an add did to a folder of kinds."""

    path: Path
    added: int  # texts the store gained
    held: int  # texts given that the store held already (or that this add repeated)
    rows: int  # texts the store holds now
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> rows before, after

    @property
    def changed(self) -> bool:
        return self.added > 0 or any(before != after for before, after in self.kinds.values())


def add_to_index(path: str | os.PathLike, texts: Sequence[str], encoder: Any = None, **keywords):
    """Add ``texts`` to the index at ``path``.

    A dense index: :func:`.build.add_to_index` (whose keywords it takes), returning the
    :class:`~.vector_index.VectorIndex`. A folder of kinds: :func:`add_to_kinds`, ``encoder``
    being its models (one, a list or a ``{kind: model}`` mapping), returning
    :class:`KindsAdded`.
    """
    if is_collection(Path(path)):
        return add_to_kinds(path, texts, () if encoder is None else encoder, **keywords)
    if encoder is None:
        raise TypeError("add_to_index needs an encoder (the model that embeds the texts)")
    return add_to_dense_index(path, texts, encoder, **keywords)


def add_to_kinds(
    path: str | os.PathLike,
    texts: Sequence[str],
    models: Sequence[Any] | Mapping[str, Any] | Any = (),
    *,
    ids: Sequence[str] | None = None,
    on_chunk=None,
    progress: Any = None,
    batch_size: int | None = None,
    **dense_options: Any,
) -> KindsAdded:
    """Add ``texts`` to the folder of kinds at ``path``: to its texts store and every kind.

    Args:
        models: the kinds' models: one, a list (each serves its own kind; a BGE-M3 model
            serves dense, sparse and multivector) or a ``{kind: model}`` mapping, as
            :meth:`~.hybrid.HybridIndex.open` takes them. Every kind but bm25 needs its own.
        ids: one string id per text; default: texts are told apart by their text alone, and
            new ones get their row numbers as ids.
        on_chunk: called with (chunk index, reused) after each chunk a kind encodes.
        progress, batch_size: passed to each model's encoding.
        dense_options: the dense add's own keywords (``source``, ``graph_progress``, the
            encoder's ``max_tokens``, ``workers``).

    Returns what was added and each kind's rows before and after (:class:`KindsAdded`). The
    order of the writes, and how an add killed part-way is finished, are in this module's
    docstring.
    """
    root = Path(path)
    texts = check_texts(texts)
    ids = None if ids is None else check_ids(ids, texts)
    if not is_collection(root):
        raise ValueError(f"{root} is not an index folder of kinds (built with --kind)")
    present = kinds_present(root)
    if not present:
        raise FileNotFoundError(f"{root} holds no committed index of any kind: build one first")
    by_kind = _models_by_kind(models, present, root)
    if dense_options and "dense" not in present:
        raise TypeError(f"{root} holds no dense index: no {', '.join(sorted(dense_options))}")
    with contextlib.ExitStack() as locks:
        for folder in (root, *(root / kind for kind in present)):
            locks.enter_context(layout.writer_lock(folder))
        store, record = open_texts(root)
        states = {kind: read_state(root, kind, record["rows"]) for kind in present}
        for kind, state in states.items():
            if state.identity is not None:
                _check_identity(root, kind, state.identity, identity_of(by_kind[kind]))
                check_add_precision(root, state, by_kind[kind])
            check_engine(state)
        held_ids, held_texts = store.all()
        new_ids, new_texts = _new_texts(held_ids, held_texts, ids, texts)
        all_ids, all_texts = held_ids + new_ids, held_texts + new_texts
        # A multi-vector kind at "auto" takes a graph once it holds more than the exact mark.
        graphs = [
            s
            for s in states.values()
            if s.kind == "multivector"
            and MultiVectorOptions(**s.meta["options"]).ann_for(len(all_texts)) == "hnsw"
        ]
        if "dense" in present or graphs:  # before any work
            engine.usearch_index_module()
        held = len(texts) - len(new_texts)
        lagging = [kind for kind in present if states[kind].rows < len(all_texts)]
        if not lagging:
            log.debug("%s already holds these %s texts: nothing to add", root, f"{len(texts):,}")
            kinds = {kind: (states[kind].rows,) * 2 for kind in present}
            return KindsAdded(root, 0, held, len(all_texts), kinds)
        if new_texts:
            log.info("adding %s texts to %s (%s held already)", f"{len(new_texts):,}", root,
                     f"{held:,}")  # fmt: skip
        content = content_hash(all_texts, all_ids)
        staged: list[StagedKind] = []
        for kind in lagging:  # steps 1 and 2: nothing visible changes
            if states[kind].rows < record["rows"]:
                log.info("the %s index holds %s of the store's %s rows: it catches up", kind,
                         f"{states[kind].rows:,}", f"{record['rows']:,}")  # fmt: skip
            staged.append(
                stage_kind(
                    root, states[kind], by_kind.get(kind), all_ids, all_texts, content,
                    on_chunk=on_chunk, progress=progress, batch_size=batch_size,
                    dense_options=dense_options,
                )
            )  # fmt: skip
        if new_texts:  # step 3: the store holds the new rows; every kind still opens
            extend_texts(root, record, all_ids, all_texts)
        else:  # a stopped add finished: what it left in the store's folder goes
            remove_stale_texts(root, record)
        for each in staged:  # step 4
            each.commit()
    kinds = {kind: (states[kind].rows,) * 2 for kind in present}
    kinds.update({each.kind: (each.before, each.after) for each in staged})
    return KindsAdded(root, len(new_texts), held, len(all_texts), kinds)


def _check_identity(root: Path, kind: str, built: ModelIdentity, given: ModelIdentity) -> None:
    """ModelMismatchError naming both models unless ``given`` is the model ``kind`` was built
    with: rows of two models in one index cannot be compared."""
    differ = built.differences(given)
    if differ:
        raise ModelMismatchError(
            f"the {kind} index of {root} was built with {built.describe()}, but the {kind} "
            f"model given is {given.describe()} (differs in {', '.join(differ)}); add with "
            f"the index's own model ({built.path or 'its path is not recorded'})"
        )


def _new_texts(
    held_ids: list[str], held_texts: list[str], ids: list[str] | None, texts: list[str]
) -> tuple[list[str], list[str]]:
    """The (ids, texts) of ``texts`` the store does not hold, in order, each once: a text is
    held if the store holds it with the same id (no ids given: the same text anywhere)."""
    named = ids is not None
    seen = set(zip(held_ids, held_texts, strict=True)) if named else set(held_texts)
    new_ids, new_texts = [], []
    for ident, text in zip(ids if named else texts, texts, strict=True):
        key = (ident, text) if named else text
        if key in seen:
            continue
        seen.add(key)
        new_ids.append(ident)
        new_texts.append(text)
    if not named:
        new_ids = [str(len(held_texts) + i) for i in range(len(new_texts))]
    else:
        clashes = set(held_ids).intersection(new_ids)
        if clashes:
            log.warning(
                "%d of the new texts have ids the folder holds with other texts (e.g. %r): "
                "each text keeps its row",
                len(clashes),
                sorted(clashes)[0],
            )
    return new_ids, new_texts


def _models_by_kind(
    models: Sequence[Any] | Mapping[str, Any] | Any, present: list[str], root: Path
) -> dict[str, Any]:
    """Kind -> its model's view for each kind present that needs one; ValueError (one line)
    for a kind left without a model, a model of a kind the folder lacks, or a model given
    for a kind that is not its own."""
    holds = ", ".join(present)
    if isinstance(models, Mapping):
        given = dict(models)
        for kind in given:
            if kind not in _MODEL_KINDS:
                raise ValueError(f"models: {kind!r} is not a kind a model serves ({_MODEL_KINDS})")
            if kind not in present:
                raise ValueError(f"models: {root} holds no {kind} index (it holds {holds})")
    else:
        if not isinstance(models, Sequence) or isinstance(models, str):
            models = [models]
        given = {}
        for model in models:
            found = model_kind_of(model)
            serves = _MODEL_KINDS if found == "bge-m3" else (found,)
            if not any(kind in present for kind in serves):
                raise ValueError(
                    f"models: a {found} model was given, but {root} holds no {found} index "
                    f"(it holds {holds})"
                )
            for kind in serves:
                if kind in present:
                    given.setdefault(kind, model)
    views = {}
    for kind in present:
        if kind == "bm25":
            continue
        if kind not in given:
            raise ValueError(
                f"{root} holds a {kind} index: give its {kind} model to add texts to it"
            )
        views[kind] = encoder_for(kind, given[kind], f"the {kind} index of {root}")
    return views

"""Sub-commands of the ``clearformer`` CLI, one module each.

Each module defines ``register(subparsers)``, which adds its parser and sets ``run`` as the
parser's ``func`` default: ``run(args) -> int`` is the exit status.
"""

# Order of appearance in `clearformer --help`. A module that is missing is skipped.
COMMANDS = (
    "encode",
    "search",
    "index",
    # These add no command: they extend encode (--output DIR), search (--index) and
    # index build (--kind).
    "encode_shards",
    "search_index",
    "index_kinds",
    "rerank",
    "eval",
    "mine",
    "serve",
    "explain",
    "train",
    "generate",
    "translate",
    "export",
    "splade_cassette",
    "bench",
    "calibrate",
    "demo",
)

"""Encoding a corpus too large for one process, in shards:

* :mod:`.shards` -- ``clearformer encode --output DIR`` under ``torchrun``: one shard per rank,
  each resumable chunk by chunk (the index's chunk store), and a manifest that checks them;
* :mod:`.ray_adapter` and :mod:`.spark_adapter` -- the model loaded once per worker inside a
  Ray Data or Spark pipeline (the ``ray`` and ``spark`` extras).

See docs/index.md ("Sharded embedding of a large corpus").
"""

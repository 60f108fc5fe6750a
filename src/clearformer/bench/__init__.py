"""The benchmark suite behind ``clearformer bench``: clearformer against its peers, side by side.

Every implementation runs in one process, under the same allocator setting, on the same
batches, timed in interleaved rounds (warm-up, repeats, medians). Each row reports real tokens
per second, the ratio to ``torch.nn`` and the model-FLOP utilisation against this machine's own
GEMM rate, measured first. See ``docs/performance.md`` for how to read the numbers.

Modules: ``workloads`` (sizes and batches), ``flops`` (model FLOPs), ``gemm`` (the machine's
rate), ``peers`` (the implementations), ``timing``, ``memory`` (peak memory in a fresh
process), ``report`` (markdown, JSON, PNG), ``suite`` (the whole run).
The entry point is :func:`clearformer.bench.suite.run_suite`; nothing is imported here, so the
memory probe (``python -m clearformer.bench.memory``) starts light.
"""

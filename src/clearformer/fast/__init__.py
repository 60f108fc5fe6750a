"""The fast paths: implementations the forward plan names, beside the reference math.

Each reads the core modules' own parameters and gives the reference's values up to float
rounding (``tests/test_agreement.py``). The core (attention, blocks, feed-forward, encoder,
reference) never imports this package; :mod:`clearformer.routes` chooses among its routes.

* :mod:`.fused_linear`: linear layers with bias, activation, residual add (and a post-norm
  LayerNorm) fused into one matrix product (oneDNN, or :mod:`.avx512_linear`).
* :mod:`.fused_blocks`: whole encoder and decoder blocks on fused linear layers.
* :mod:`.reordered_weights`: weights reordered once per caller for the fused products.
* :mod:`.varlen`, :mod:`.varlen_threads`: attention on packed rows (no padding computed).
* :mod:`.avx512`, :mod:`.avx512_linear`: clearformer's own AVX-512 kernels, built on request.
"""

"""Inputs and hard-coded outputs of PyTorch's own deterministic decoder tests.

Copied from pytorch/pytorch, ``test/test_nn.py`` (commit 74f2fa66feec00335f72813782f4802e80bff4cb):
``TestNN.test_transformerdecoderlayer``, ``TestNN.test_transformerdecoderlayer_gelu`` and
``TestNN.test_transformerdecoder``. Every tensor is written as PyTorch's test writes it, sequence
first: targets (T, B, D), memories (S, B, D), outputs (T, B, D); the test's ``perm_fn`` transposes
them for ``batch_first=True``. Padding is given as the (batch, position) pairs the test sets to
True in its key padding masks.

The model of all these tests: d_model 4, 2 heads, dim_feedforward 16, dropout 0, every parameter
``p`` of the decoder layer set to ``torch.cos(torch.arange(p.numel()).float().view(p.shape))``;
a stack deep-copies that layer, and its final norm is a fresh ``nn.LayerNorm(4)`` (weight 1,
bias 0).
"""

from __future__ import annotations

# fmt: off

# One target token and one memory token, large values.
TGT_ONE = [[[20.0, 30.0, 40.0, 50.0]]]
MEM_ONE = [[[60.0, 70.0, 80.0, 90.0]]]

# Two target tokens (T=2, B=1), one memory token.
TGT_TWO = [[[9.0, 10.0, 11.0, 12.0]],
           [[11.0, 12.0, 13.0, 14.0]]]
MEM_TWO_ONE = [[[1.0, 2.0, 3.0, 4.0]]]

# Two target tokens (T=2, B=1), two memory tokens (S=2, B=1).
TGT_TWO_SMALL = [[[1.0, 2.0, 3.0, 4.0]],
                 [[5.0, 6.0, 7.0, 8.0]]]
MEM_TWO = [[[9.0, 10.0, 11.0, 12.0]],
           [[11.0, 12.0, 13.0, 14.0]]]

# A batch: T=3 target tokens and S=5 memory tokens for B=2 sequences.
TGT_BATCH = [[[0.4517, 0.6793, 0.5313, 0.0034],
              [0.2678, 0.3677, 0.4459, 0.7166]],
             [[0.8100, 0.3716, 0.4096, 0.1976],
              [0.6958, 0.8844, 0.6081, 0.8315]],
             [[0.0494, 0.9343, 0.5955, 0.3830],
              [0.5404, 0.3464, 0.9378, 0.6200]]]
MEM_BATCH = [[[0.7462, 0.6653, 0.5679, 0.4891],
              [0.5387, 0.1655, 0.3565, 0.0471]],
             [[0.8335, 0.2799, 0.5031, 0.2947],
              [0.1402, 0.0318, 0.7636, 0.1346]],
             [[0.6333, 0.9344, 0.1376, 0.9938],
              [0.8924, 0.2872, 0.6692, 0.2944]],
             [[0.9897, 0.6915, 0.3154, 0.1733],
              [0.8645, 0.3513, 0.3064, 0.0767]],
             [[0.8117, 0.2366, 0.4838, 0.7881],
              [0.3718, 0.4945, 0.9511, 0.0864]]]

# key_padding_mask[0, 2] = key_padding_mask[1, 1] = key_padding_mask[1, 2] = 1 (of a (2, 3) mask)
TGT_BATCH_PADDING = ((0, 2), (1, 1), (1, 2))
# key_padding_mask[0, 4] = key_padding_mask[1, 3] = key_padding_mask[1, 4] = 1 (of a (2, 5) mask)
MEM_BATCH_PADDING = ((0, 4), (1, 3), (1, 4))

# ReLU layer (test_transformerdecoderlayer; test_transformerdecoder with 1 layer gives the same).
RELU_ONE = [[[2.314351, 0.094805, -0.671322, 0.101977]]]
RELU_TWO = [[[2.422245, 0.051716, -0.606338, -0.024756]],
            [[2.422245, 0.051716, -0.606338, -0.024756]]]
RELU_TWO_SMALL = [[[2.343536, 0.085561, -0.654954, 0.074991]],
                  [[2.343536, 0.085561, -0.654954, 0.074991]]]
RELU_BATCH = [[[2.430065, 0.027862, -0.601136, -0.073096],
               [2.431935, 0.028907, -0.599809, -0.072488]],
              [[2.428457, 0.027053, -0.602275, -0.073462],
               [2.431970, 0.029387, -0.599789, -0.071621]],
              [[2.431934, 0.028196, -0.599802, -0.073809],
               [2.432306, 0.028858, -0.599542, -0.072846]]]
RELU_BATCH_TGT_PADDED = [[[2.430025, 0.027643, -0.601164, -0.073476],
                          [2.4323, 0.029375, -0.599553, -0.071881]],
                         [[2.428523, 0.026838, -0.602226, -0.07391],
                          [2.432634, 0.029842, -0.599318, -0.071253]],
                         [[2.432278, 0.028152, -0.599555, -0.074139],
                          [2.432659, 0.029244, -0.599294, -0.072382]]]
RELU_BATCH_MEM_PADDED = [[[2.429757, 0.027358, -0.601351, -0.073816],
                          [2.432692, 0.028583, -0.599263, -0.073634]],
                         [[2.428247, 0.02662, -0.602419, -0.074123],
                          [2.432657, 0.029055, -0.599293, -0.072732]],
                         [[2.431515, 0.027687, -0.600096, -0.074459],
                          [2.433075, 0.028543, -0.598987, -0.073985]]]

# GELU layer (test_transformerdecoderlayer_gelu; test_transformerdecoder's gelu part, 1 layer).
GELU_ONE = [[[2.306435, 0.095946, -0.675796, 0.10687]]]
GELU_TWO = [[[2.415448, 0.054389, -0.610932, -0.0156613]],
            [[2.415448, 0.054389, -0.610932, -0.0156613]]]
GELU_TWO_SMALL = [[[2.338531, 0.087709, -0.65776, 0.080646]],
                  [[2.338531, 0.087709, -0.65776, 0.080646]]]
GELU_BATCH = [[[2.42049104, 0.03443088, -0.60793706, -0.05436271],
               [2.42210631, 0.03546578, -0.60679895, -0.05357488]],
              [[2.41907674, 0.0336104, -0.60892977, -0.05490462],
               [2.42216881, 0.03586554, -0.6067524, -0.05289126]],
              [[2.42205716, 0.03488046, -0.60683681, -0.05460596],
               [2.42240309, 0.0354595, -0.60659063, -0.05378816]]]

# ReLU stacks (test_transformerdecoder): 2 or 6 copies of the layer, with or without a final norm.
RELU_2_LAYERS_ONE = [[[2.31316, 0.0950293, -0.671995, 0.102802]]]
RELU_6_LAYERS_BATCH = [[[2.42794, 0.026164, -0.60263, -0.0747591],
                        [2.43113, 0.0279516, -0.600376, -0.0736896]],
                       [[2.42794, 0.026164, -0.60263, -0.0747591],
                        [2.43113, 0.0279516, -0.600376, -0.0736896]],
                       [[2.42794, 0.026164, -0.60263, -0.0747591],
                        [2.43113, 0.0279516, -0.600376, -0.0736896]]]
RELU_2_LAYERS_NORM_ONE = [[[1.66166, -0.326986, -1.01466, -0.320017]]]
RELU_6_LAYERS_NORM_BATCH = [[[1.69559, -0.357291, -0.894741, -0.443553],
                             [1.69571, -0.357363, -0.894154, -0.444196]],
                            [[1.69559, -0.357291, -0.894741, -0.443553],
                             [1.69571, -0.357363, -0.894154, -0.444196]],
                            [[1.69559, -0.357291, -0.894741, -0.443553],
                             [1.69571, -0.357363, -0.894154, -0.444196]]]

# fmt: on

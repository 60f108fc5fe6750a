"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes, no
download) as a sequence of patches, classified by a small encoder.

Each image is cut into patches (``2x2``: 16 tokens of 4 pixels; ``4x4``: 4 of 16; ``row``: 8
of 8), pixel values scaled from 0..16 to 0..1. The split is stratified and fixed by
``split_seed``, so runs with different seeds are scored on the same test images.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from ...config import EncoderConfig
from ..collate import VectorBatch
from ..config import TrainConfig
from ..models import PatchClassifier
from .base import stratified_split


def load_digits_arrays() -> tuple[Tensor, Tensor]:
    """Images (1797, 8, 8) float32 in [0, 1] and labels (1797,) int64."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError:
        raise ValueError(
            "task='digits' needs scikit-learn, which ships the digits images: "
            "pip install 'clearformer[train]' (or pip install scikit-learn)"
        ) from None
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32) / 16.0  # (1797, 8, 8)
    return images, torch.tensor(data.target, dtype=torch.int64)


def to_patches(images: Tensor, patch: str) -> Tensor:
    """(B, 8, 8) images -> (B, T, F) patch sequences in reading order."""
    B = images.shape[0]
    if patch == "row":
        return images  # (B, 8, 8): 8 tokens of one row each
    side = {"2x2": 2, "4x4": 4}[patch]
    n = 8 // side
    x = images.reshape(B, n, side, n, side)  # (B, patch row, pixel row, patch col, pixel col)
    return x.permute(0, 1, 3, 2, 4).reshape(B, n * n, side * side)  # (B, T, F)


class DigitsTask:
    name = "digits"
    metric = "accuracy"
    metrics = ("accuracy",)
    labels = tuple(str(d) for d in range(10))

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        images, labels = load_digits_arrays()
        patches = to_patches(images, config.patch)  # (1797, T, F)
        train, held = stratified_split(labels.tolist(), config.eval_fraction, config.split_seed)
        self.train_x, self.train_y = patches[train], labels[train]
        self.eval_x, self.eval_y = patches[held], labels[held]
        self.train_lengths = [patches.shape[1]] * len(train)

    def build_model(self) -> PatchClassifier:
        c = self.config
        encoder = EncoderConfig(
            d_model=c.d_model,
            n_heads=c.n_heads,
            n_layers=c.n_layers,
            dim_mlp=c.dim_mlp,
            dropout=c.dropout,
            activation="gelu",
        )
        _, T, F = self.train_x.shape
        return PatchClassifier(encoder, T, F, len(self.labels), c.pooling)

    def train_batch(self, indices: Sequence[int]) -> VectorBatch:
        index = torch.as_tensor(list(indices), dtype=torch.int64)
        return VectorBatch(self.train_x[index], self.train_y[index])

    def eval_batches(self, batch_size: int) -> Iterator[VectorBatch]:
        for start in range(0, len(self.eval_y), batch_size):
            end = start + batch_size
            yield VectorBatch(self.eval_x[start:end], self.eval_y[start:end])

    def describe(self) -> dict:
        _, T, F = self.train_x.shape
        return {
            "task": self.name,
            "train_examples": len(self.train_y),
            "eval_examples": len(self.eval_y),
            "tokens_per_example": T,
            "features_per_token": F,
            "labels": list(self.labels),
        }

"""ONNX Runtime as a sentence encoder, built by the encode benchmark from the local checkpoint.

The way ONNX Runtime is commonly deployed for a BERT-family sentence encoder: the Hugging Face
model exported to ONNX, ONNX Runtime's transformer optimiser fusing its subgraphs, and dynamic
int8 quantisation on top. Nothing is downloaded; every model is built from the bundled
all-MiniLM-L6-v2 in a scratch folder.

Models (``build_models``):

``onnxruntime``             ``transformers``' ``BertModel`` exported by ``torch.onnx`` (the
                            TorchScript exporter, opset 17), run with every graph optimisation
                            the session has (``ORT_ENABLE_ALL``): it fuses LayerNorm, bias +
                            GELU and the scaled score product; attention stays two products
                            and a softmax.
``onnxruntime optimised``   the same graph through ``onnxruntime.transformers.optimizer``
                            (``model_type="bert"``): embeddings + LayerNorm, attention, bias +
                            GELU and skip + LayerNorm each fused into one contrib operator.
``onnxruntime int8``        the exported graph through ``quantize_dynamic`` with its defaults:
                            int8 weights with one scale per tensor, activations quantised per
                            call (the fastest int8 graph measured). Only the six weight
                            products of each layer become integer; attention's two products
                            stay float ``MatMul``.
``onnxruntime int8 per-channel``  the same with one weight scale per output channel
                            (``per_channel=True``).
``onnxruntime int8 per-channel, attention float32``  the optimised graph with only its
                            ``MatMul`` nodes quantised per channel (``op_types_to_quantize``):
                            the attention operator, its projections and the embeddings stay
                            float32. The most accurate of ONNX Runtime's int8 variants tried,
                            and the slowest.

Encoding (``OnnxEncoder``): the checkpoint's own tokenizer (the same truncation at 256 pieces
as the other libraries), texts sorted by length and run in batches of 16 padded texts (the
fastest of 16, 32, 64 and 128 on both benchmark corpora), mean pooling over real tokens and
L2 normalisation in NumPy, all inside the timed call. Sessions run sequentially on the
benchmark's threads with spinning off: ONNX Runtime's threads otherwise keep spinning after a
call and take the cores from whichever configuration runs next, while turning it off did not
slow ONNX Runtime itself.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

BATCH_SIZE = 16
OPSET = 17


def available() -> bool:
    """onnx and onnxruntime (with its transformer optimiser) are installed."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        from onnxruntime.transformers import optimizer  # noqa: F401
    except ImportError:
        return False
    return True


def build_models(checkpoint: Path, workdir: Path) -> tuple[dict[str, Path], dict]:
    """Export, optimise and quantise ``checkpoint`` into ``workdir``: the model files by
    configuration name, and what the transformer optimiser fused (operator -> count)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel

    # Eager attention exports as the MatMul / Softmax pattern the optimiser recognises; the
    # SDPA variant exports as an operator it leaves unfused.
    model = AutoModel.from_pretrained(str(checkpoint), attn_implementation="eager").eval()
    config = model.config
    plain = workdir / "model.onnx"
    ids = torch.ones(2, 16, dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _HiddenStates(model),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(plain),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]},
            opset_version=OPSET,
            dynamo=False,
        )
    optimised = optimize_model(
        str(plain),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
    )
    fused = {op: n for op, n in optimised.get_fused_operator_statistics().items() if n}
    optimised_path = workdir / "model-optimised.onnx"
    optimised.save_model_to_file(str(optimised_path))
    paths = {"onnxruntime": plain, "onnxruntime optimised": optimised_path}
    # The contrib operators have no ONNX shape inference: tell the quantiser their outputs
    # are float32.
    extra = {"DefaultTensorType": 1}  # onnx.TensorProto.FLOAT
    variants = {
        "onnxruntime int8": (plain, {}),
        "onnxruntime int8 per-channel": (plain, {"per_channel": True}),
        "onnxruntime int8 per-channel, attention float32": (
            optimised_path,
            {"per_channel": True, "op_types_to_quantize": ["MatMul"]},
        ),
    }
    for index, (name, (source, options)) in enumerate(variants.items()):
        target = workdir / f"model-int8-{index}.onnx"
        quantize_dynamic(
            str(source), str(target), weight_type=QuantType.QInt8, extra_options=extra, **options
        )
        paths[name] = target
    return paths, fused


class _HiddenStates(torch.nn.Module):
    """A ``BertModel`` that takes positional ids, mask and token types and returns the last
    hidden states alone (the export's inputs and output)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


@dataclass
class OnnxEncoder:
    """``encode(texts)`` -> (N, D) float32 unit vectors, with one ONNX Runtime session."""

    session: object
    tokenizer: object  # clearformer's TextTokenizer for the same checkpoint
    dim: int
    batch_size: int = BATCH_SIZE

    @classmethod
    def load(cls, path: Path, tokenizer, dim: int, threads: int) -> OnnxEncoder:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # no warnings about hardware-specific fusions
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return cls(session, tokenizer, dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        from clearformer.text.batching import plan_batches

        encodings = self.tokenizer.encode(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Longest first, `batch_size` texts at a time: the batches `encode` makes with a size.
        for rows in plan_batches([len(e.ids) for e in encodings], self.batch_size):
            batch = self.tokenizer.pad([encodings[i] for i in rows], with_tokens=False)
            mask = batch.attention_mask.numpy()  # (B, T) bool
            (hidden,) = self.session.run(
                None,
                {
                    "input_ids": batch.input_ids.numpy(),
                    "attention_mask": mask.astype(np.int64),
                    "token_type_ids": batch.token_type_ids.numpy(),
                },
            )  # (B, T, D)
            weights = mask[..., None].astype(np.float32)  # (B, T, 1)
            mean = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)  # (B, D)
            out[rows] = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Build the ONNX Runtime models the encode benchmark compares against, "
        "without timing anything: the export, the optimised graph and the three int8 graphs, "
        "written to --out, with what the transformer optimiser fused. "
        "(benchmarks/encode_throughput.py builds them itself, in a scratch folder.)"
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="Hugging Face BERT checkpoint directory (default: the bundled all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the .onnx files (created if missing)"
    )
    args = parser.parse_args()
    if not available():
        parser.error("needs onnx and onnxruntime: pip install 'clearformer[onnx]'")
    if args.model is None:
        from clearformer.interop.hf import bundled_model_dir

        args.model = bundled_model_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    paths, fused = build_models(args.model, args.out)
    for name, path in paths.items():
        print(f"{name}: {path}")
    print("fused: " + ", ".join(f"{op} {n}" for op, n in fused.items()))


if __name__ == "__main__":
    main()

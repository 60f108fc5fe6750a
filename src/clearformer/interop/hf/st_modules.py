"""A sentence-transformers directory's modules after the Transformer, read into a
:class:`~clearformer.heads.sentence.SentenceHeadConfig` and the Dense layers' tensors.

``modules.json`` lists the modules in the order they run: the Transformer, a Pooling, then
any ``Dense`` and ``Normalize`` modules (EmbeddingGemma: Pooling(mean) -> Dense 768->3072 ->
Dense 3072->768 -> Normalize). A Dense module's folder holds its ``config.json``
(``in_features``, ``out_features``, ``bias``, ``activation_function`` as a dotted torch class
name, ``use_residual``) and its weights (``model.safetensors`` or ``pytorch_model.bin``:
``linear.weight``, ``linear.bias``, ``residual.weight``), as sentence-transformers 6 writes
them.

The Matryoshka widths a model was trained to be cut to come from ``matryoshka_dimensions`` in
config.json (where vLLM and SGLang read them) or in ``config_sentence_transformers.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import Tensor

from ...heads.sentence import DenseConfig, SentenceHead, SentenceHeadConfig, head_steps
from ...io import atomic_write
from .files import CheckpointError, CheckpointFiles, read_json
from .sentence_transformers import pooling_from_config
from .weights import read_tensors, write_safetensors

log = logging.getLogger(__name__)

# sentence-transformers' saved names of the activations a Dense module applies.
DENSE_ACTIVATION_NAMES = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.ReLU": "relu",
    # Loading builds the class with no arguments: GELU() is the exact (erf) one.
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.SiLU": "silu",
}
_DENSE_KEYS = {
    "in_features",
    "out_features",
    "bias",
    "activation_function",
    "module_input_name",
    "module_output_name",
    "use_residual",
}
_EMBEDDING = "sentence_embedding"
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def module_kind(module: dict[str, Any]) -> str:
    """``"Dense"`` for ``sentence_transformers.base.modules.dense.Dense``, and so on."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def read_head(files: CheckpointFiles, d_model: int) -> tuple[SentenceHeadConfig, dict[str, Tensor]]:
    """The head a directory's modules describe, and the state dict of its Dense layers.

    Without ``modules.json``: mean pooling, nothing after it (sentence-transformers' choice for
    a plain transformers checkpoint).

    Raises:
        CheckpointError: a module clearformer does not run, modules out of order, a Dense
            config or weights that do not fit, naming the file and the field.
    """
    modules = files.modules
    pooling = pooling_from_config(files.pooling_config, files.pooling_path)
    matryoshka = matryoshka_from_files(files)
    if modules is None:
        return SentenceHeadConfig(d_model, pooling.mode, matryoshka_dimensions=matryoshka), {}
    source = files.path / "modules.json"
    kinds = [module_kind(m) for m in modules]
    supported = ("Transformer", "Pooling", "Dense", "Normalize")
    unsupported = [k for k in kinds if k not in supported]
    if unsupported:
        raise CheckpointError(
            f"{source} lists sentence-transformers modules clearformer does not run: "
            f"{unsupported}; supported: {', '.join(supported)}"
        )
    after = kinds.index("Pooling") + 1 if "Pooling" in kinds else 1
    if (
        kinds[:1] != ["Transformer"]
        or kinds[1:after] not in ([], ["Pooling"])
        or any(k in ("Transformer", "Pooling") for k in kinds[after:])
    ):
        raise CheckpointError(
            f"{source} must list the Transformer, a Pooling, then Dense and Normalize modules, "
            f"in that order; got {kinds}"
        )
    steps: list = []
    tensors: dict[str, Tensor] = {}
    width = d_model
    for module in modules[after:]:
        if module_kind(module) == "Normalize":
            _check_normalize(files.path, module)
            steps.append("normalize")
            continue
        dense, weights = read_dense(files.path / str(module.get("path", "")), width)
        tensors.update({f"dense.{len(steps)}.{key}": value for key, value in weights.items()})
        steps.append(dense)
        width = dense.out_features
    kept, normalize = head_steps(steps)
    try:
        config = SentenceHeadConfig(d_model, pooling.mode, kept, normalize, matryoshka)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    return config, tensors


def _check_normalize(root: Path, module: dict[str, Any]) -> None:
    file = root / str(module.get("path", "")) / "config.json"
    config = read_json(file, "Normalize config") if file.is_file() else {}
    for key in ("module_input_name", "module_output_name"):
        value = config.get(key) if isinstance(config, dict) else None
        if value not in (None, _EMBEDDING):
            raise CheckpointError(
                f"{file} {key!r} must be {_EMBEDDING!r} (clearformer normalises sentence "
                f"embeddings, not token embeddings), got {value!r}"
            )


def read_dense(
    folder: Path, width: int, *, on: str = _EMBEDDING
) -> tuple[DenseConfig, dict[str, Tensor]]:
    """One Dense module's config and tensors (``linear.weight``, ...), checked against the
    ``width`` of the vector it receives; ``on`` is what it must run on: ``"sentence_embedding"``
    (a pooled vector) or ``"token_embeddings"`` (each token's, a multi-vector projection)."""
    file = folder / "config.json"
    if not file.is_file():
        raise CheckpointError(f"a Dense module lacks its config: {file} is missing")
    raw = read_json(file, "Dense config")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} must hold a JSON object, got {type(raw).__name__}")
    extra = sorted(set(raw) - _DENSE_KEYS)
    if extra:  # sentence-transformers drops them with a warning too
        log.warning("%s: ignoring Dense config keys %s", file, extra)
    for key in ("module_input_name", "module_output_name"):
        if raw.get(key) not in (None, on):
            raise CheckpointError(
                f"{file} {key!r} must be {on!r} (a Dense on the "
                f"{'sentence embedding' if on == _EMBEDDING else 'token embeddings'}), "
                f"got {raw.get(key)!r}"
            )
    name = raw.get("activation_function", "torch.nn.modules.activation.Tanh")
    if name not in DENSE_ACTIVATION_NAMES:
        raise CheckpointError(
            f"{file} 'activation_function'={name!r} is not supported; supported: "
            f"{', '.join(DENSE_ACTIVATION_NAMES)}"
        )
    try:
        config = DenseConfig(
            in_features=raw.get("in_features"),
            out_features=raw.get("out_features"),
            bias=raw.get("bias", True),
            activation=DENSE_ACTIVATION_NAMES[name],
            residual=raw.get("use_residual", False),
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: {exc}") from None
    if config.in_features != width:
        raise CheckpointError(
            f"{file} 'in_features' must be {width} (the width of the vector it receives), "
            f"got {config.in_features}"
        )
    weights = next((folder / n for n in DENSE_WEIGHTS if (folder / n).is_file()), None)
    if weights is None:
        raise CheckpointError(
            f"a Dense module lacks its weights: {folder} has neither {' nor '.join(DENSE_WEIGHTS)}"
        )
    tensors = read_tensors(weights)
    expected = _dense_shapes(config)
    if set(tensors) != set(expected):
        raise CheckpointError(
            f"{weights} must hold exactly {sorted(expected)} for its config.json, got "
            f"{sorted(tensors)}"
        )
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise CheckpointError(
                f"{weights} {key!r} has shape {tuple(tensors[key].shape)}, expected {shape} "
                f"from {file} (in_features, out_features)"
            )
    return config, tensors


def _dense_shapes(config: DenseConfig) -> dict[str, tuple[int, ...]]:
    shapes = {"linear.weight": (config.out_features, config.in_features)}
    if config.bias:
        shapes["linear.bias"] = (config.out_features,)
    if config.residual and config.in_features != config.out_features:
        shapes["residual.weight"] = (config.out_features, config.in_features)
    return shapes


def build_head(config: SentenceHeadConfig, tensors: dict[str, Tensor]) -> SentenceHead:
    """A :class:`SentenceHead` with the Dense tensors :func:`read_head` returned, in eval mode."""
    head = SentenceHead(config)
    head.load_state_dict(tensors, strict=True)  # read_head checked every name and shape
    return head.eval()


def matryoshka_from_files(files: CheckpointFiles) -> tuple[int, ...]:
    """``matryoshka_dimensions`` from config.json or config_sentence_transformers.json
    (empty when neither has it)."""
    sources = [(files.path / "config.json", files.config)]
    st_file = files.path / "config_sentence_transformers.json"
    if st_file.is_file():
        sources.append((st_file, read_json(st_file, "sentence-transformers config")))
    for source, config in sources:
        value = config.get("matryoshka_dimensions") if isinstance(config, dict) else None
        if value is None:
            continue
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        ):
            raise CheckpointError(
                f"{source} 'matryoshka_dimensions' must be a non-empty list of positive ints, "
                f"got {value!r}"
            )
        return tuple(value)
    return ()


def truncate_dim_from_files(files: CheckpointFiles) -> int | None:
    """``truncate_dim`` of config_sentence_transformers.json, where a directory records the
    width its embeddings are cut to by default (sentence-transformers takes it as a
    constructor argument); None when absent."""
    st_file = files.path / "config_sentence_transformers.json"
    if not st_file.is_file():
        return None
    config = read_json(st_file, "sentence-transformers config")
    value = config.get("truncate_dim") if isinstance(config, dict) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise CheckpointError(f"{st_file} 'truncate_dim' must be a positive int, got {value!r}")
    return value


def write_head(head: SentenceHead, modules: list[dict[str, Any]], source: Path, out: Path):
    """Write the folders of the Pooling, Dense and Normalize modules of ``modules`` (the loaded
    directory's modules.json, which the caller copies) under ``out``: configs from ``source``,
    Dense weights from ``head``, so a head changed after loading is saved as it now is."""
    dense_at = 0
    state = head.state_dict()
    for module in modules:
        kind, folder = module_kind(module), str(module.get("path", ""))
        if kind not in ("Pooling", "Dense", "Normalize") or not folder:
            continue
        target = out / folder
        target.mkdir(parents=True, exist_ok=True)
        config = source / folder / "config.json"
        if config.is_file():
            with atomic_write(target / "config.json", "wb") as handle:
                handle.write(config.read_bytes())
        if kind == "Dense":
            while not isinstance(head.config.steps[dense_at], DenseConfig):
                dense_at += 1
            prefix = f"dense.{dense_at}."
            tensors = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            write_safetensors(tensors, target / "model.safetensors")
            dense_at += 1

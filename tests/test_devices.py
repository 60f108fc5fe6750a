"""``device=`` of ``TextEncoder`` and ``CrossEncoder`` (and ``--device`` of the commands):
checked before any weight is read, named in every refusal, the CPU by default, and int8 on the
CPU alone. The run on a GPU itself is tests/test_cuda.py's (skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clearformer import CrossEncoder, TextEncoder
from clearformer.cli import main
from clearformer.devices import check_device
from clearformer.precision import choose_precision

from .helpers import write_tiny_bert
from .test_sequence_classification import make_classifier

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat"]
TEXTS = ["the cat sat", "a cat on the mat sat on a mat", "mat"]


@pytest.mark.parametrize("given", [None, "cpu", "cpu:0", torch.device("cpu")])
def test_the_cpu_by_default_and_by_name(given):
    assert check_device(given) == torch.device("cpu")


@pytest.mark.parametrize(
    ("given", "error", "words"),
    [
        ("gpu", ValueError, ["device must be a device", "'gpu'"]),
        ("", ValueError, ["device must be a device", "''"]),
        ("meta", ValueError, ["one of cpu, cuda, mps", "'meta'"]),
        (3, TypeError, ["device must be None", "int"]),
    ],
)
def test_a_bad_device_is_refused_by_name(given, error, words):
    with pytest.raises(error) as caught:
        check_device(given)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("given", ["cuda", "cuda:1", torch.device("cuda")])
def test_cuda_without_a_gpu_is_refused(given):
    with pytest.raises(ValueError, match="needs a CUDA GPU.*sees none; use 'cpu'"):
        check_device(given, "--device")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_cuda_index_beyond_the_devices_is_refused():
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"has {count} CUDA device"):
        check_device(f"cuda:{count}")
    assert check_device("cuda") == torch.device("cuda", torch.cuda.current_device())


def test_int8_runs_on_the_cpu_alone():
    cuda = torch.device("cuda")  # a device object needs no GPU to exist
    with pytest.raises(ValueError, match="'int8' runs on CPUs only.*on cuda use 'bf16'"):
        choose_precision("int8", device=cuda)
    assert choose_precision("bf16", device=cuda).choice == "bf16"


@pytest.mark.parametrize(
    ("capability", "offered", "expected"),
    [((8, 0), None, "bf16"), ((9, 0), None, "bf16"), ((7, 5), None, "float32"),
     ((8, 6), ("float32", "int8"), "float32")],
)  # fmt: skip
def test_auto_on_a_cuda_gpu_takes_bf16_from_ampere_on(monkeypatch, capability, offered, expected):
    """auto off the CPU: bf16 where the GPU has bfloat16 tensor cores (compute capability 8.0
    on) and bf16 is offered; float32 otherwise, and on any other device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda")
    kwargs = {} if offered is None else {"offered": offered}
    decision = choose_precision("auto", device=cuda, **kwargs)
    assert decision.choice == expected
    assert f"{capability[0]}.{capability[1]}" in decision.reason or offered is not None
    assert choose_precision("auto", device=torch.device("meta")).choice == "float32"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("bert"), WORDS, n_layers=2)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    directory = tmp_path_factory.mktemp("classifier")
    make_classifier("bert", directory, num_labels=1)
    return directory


def test_text_encoder_on_the_cpu_by_name_equals_the_default(bert):
    default = TextEncoder.from_pretrained(bert)
    named = TextEncoder.from_pretrained(bert, device=torch.device("cpu"))
    assert named.device == default.device == torch.device("cpu")
    assert np.array_equal(named.encode(TEXTS), default.encode(TEXTS))
    assert np.array_equal(
        named.encode(TEXTS, precision="bf16"), default.encode(TEXTS, precision="bf16")
    )


def test_cross_encoder_on_the_cpu_by_name_equals_the_default(classifier):
    pairs = [("the cat", "sat on the mat"), ("a mat", "the cat")]
    default = CrossEncoder.from_pretrained(classifier)
    named = CrossEncoder.from_pretrained(classifier, device="cpu")
    assert named.device == torch.device("cpu")
    assert np.array_equal(named.predict(pairs), default.predict(pairs))


@pytest.mark.parametrize("loader", [TextEncoder, CrossEncoder], ids=lambda c: c.__name__)
def test_the_device_is_checked_before_any_file_is_read(loader, tmp_path):
    missing = tmp_path / "no-such-model"  # reading it would raise FileNotFoundError
    with pytest.raises(ValueError, match="device must be a device.*'gpu'"):
        loader.from_pretrained(missing, device="gpu")


def test_int8_held_on_another_device_is_refused_before_any_read(monkeypatch, tmp_path):
    # As if a GPU were present: the int8 rule, not CUDA's absence, must refuse the load.
    import clearformer.text.encoder as encoder_module

    monkeypatch.setattr(encoder_module, "check_device", lambda device: torch.device("cuda"))
    with pytest.raises(ValueError, match="'int8' runs on CPUs only"):
        TextEncoder.from_pretrained(tmp_path / "no-such-model", precision="int8", device="cuda")


def test_other_kinds_refuse_another_device(monkeypatch):
    import clearformer.commands.kind_models as kind_models
    import clearformer.devices as devices

    monkeypatch.setattr(devices, "check_device", lambda device, name: torch.device("cuda"))
    with pytest.raises(ValueError, match="--device cuda: sparse models run on the CPU"):
        kind_models.load_model("sparse", "/no/such/model", device="cuda")


def test_encode_command_names_a_bad_device_in_one_line(bert, capsys):
    code = main(["encode", "--model", str(bert), "--device", "gpu", "the cat"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1
    assert "--device must be a device" in err and "'gpu'" in err


def test_encode_command_on_the_cpu_by_name(bert, tmp_path, capsys):
    by_name, default = tmp_path / "named.npy", tmp_path / "default.npy"
    assert (
        main(["encode", "--model", str(bert), "--device", "cpu", "-o", str(by_name), *TEXTS]) == 0
    )
    assert main(["encode", "--model", str(bert), "-o", str(default), *TEXTS]) == 0
    assert np.array_equal(np.load(by_name), np.load(default))


def test_serve_config_checks_the_device():
    from clearformer.serve import ServeConfig

    assert ServeConfig(device="cpu").device == "cpu"
    with pytest.raises(ValueError, match="device must be a device.*'gpu'"):
        ServeConfig(device="gpu")


def test_serve_refuses_int8_on_another_device(monkeypatch):
    import clearformer.devices as devices
    from clearformer.serve import ServeConfig

    monkeypatch.setattr(devices, "check_device", lambda device, name="device": torch.device("cuda"))
    with pytest.raises(ValueError, match="precision='int8' runs on CPUs only.*device='cuda'"):
        ServeConfig(device="cuda", precision="int8")
    assert ServeConfig(device="cuda", precision="bf16").device == "cuda"


def test_serve_refuses_a_sparse_model_on_another_device(monkeypatch, tmp_path):
    import clearformer.serve.token_models as token_models
    from clearformer.serve import ModelSpec

    monkeypatch.setattr(token_models, "model_kind", lambda path: "sparse")
    monkeypatch.setattr(token_models, "check_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(token_models, "load_sparse", None)  # must not be reached
    with pytest.raises(ValueError, match="'splade' is a sparse model, which runs on the CPU"):
        token_models.load_served_model(
            ModelSpec(path=str(tmp_path), name="splade"),
            max_input_tokens=None,
            precision="float32",
            backend="auto",
            device="cuda",
        )


def test_serve_command_names_a_bad_device_in_one_line(capsys):
    pytest.importorskip("uvicorn")
    code = main(["serve", "--device", "gpu"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1
    assert "--device must be a device" in err and "'gpu'" in err


def _as_if_cuda(monkeypatch):
    """clearformer.devices.check_device answering cuda for anything but None and "cpu": the
    rules that apply on a GPU, tried where none is."""
    import clearformer.devices as devices

    real = devices.check_device

    def check(device, name="device"):
        return real(device, name) if device in (None, "cpu") else torch.device("cuda")

    monkeypatch.setattr(devices, "check_device", check)


@pytest.mark.parametrize(
    "argv",
    [
        ["index", "add", "IDX", "--corpus", "CORPUS"],
        ["search", "--index", "IDX", "the cat"],
        ["search", "--corpus", "CORPUS", "the cat"],
        ["index", "build", "--out", "IDX2", "--corpus", "CORPUS"],
        ["mine", "--data", "IDX", "--out", "OUT"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_every_command_checks_its_device_flag(argv, bert, tmp_path, capsys):
    """Every command with --device refuses a bad one in one line, before it reads anything
    (index add and search --index once ignored it)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat\na mat\n")
    built = ["index", "build", "--out", str(tmp_path / "idx"), "--corpus", str(corpus)]
    assert main([*built, "--model", str(bert)]) == 0
    capsys.readouterr()
    names = {
        "IDX": str(tmp_path / "idx"),
        "IDX2": str(tmp_path / "idx2"),
        "CORPUS": str(corpus),
        "OUT": str(tmp_path / "o.jsonl"),
    }
    code = main([names.get(a, a) for a in argv] + ["--device", "gpu"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1, err
    assert "--device must be a device" in err and "'gpu'" in err


def test_int8_with_another_device_is_refused_naming_both_flags(monkeypatch, bert, capsys):
    _as_if_cuda(monkeypatch)
    code = main(["encode", "--model", str(bert), "--device", "cuda", "--precision", "int8", "a"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert "--precision int8 runs on the CPU alone; with --device cuda" in err


def test_serve_refuses_a_sparse_model_before_it_starts(monkeypatch, tmp_path, capsys):
    pytest.importorskip("uvicorn")
    import clearformer.model_kinds as model_kinds

    _as_if_cuda(monkeypatch)
    monkeypatch.setattr(model_kinds, "model_kind", lambda path: "sparse")
    code = main(["serve", "--device", "cuda", "--model", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert "a sparse model runs on the CPU here" in err


def test_an_int8_encoder_keeps_no_checkpoint(bert, monkeypatch):
    """Once every layer is read and converted, neither the encoder nor its load keeps the
    reading plan, which holds the checkpoint (all of a .bin file's tensors)."""
    import gc
    import weakref

    from clearformer.interop.hf.deferred import DeferredLayers
    from clearformer.quant.int8 import int8_support

    if not int8_support().available:
        pytest.skip(int8_support().reason)
    refs = []
    read = DeferredLayers.read

    def spy(self, index):
        refs.append(weakref.ref(self.plan.checkpoint))
        read(self, index)

    monkeypatch.setattr(DeferredLayers, "read", spy)
    encoder = TextEncoder.from_pretrained(bert, precision="int8")
    gc.collect()
    assert refs and all(ref() is None for ref in refs)
    assert encoder._loaded.deferred is None


def test_a_cross_encoder_reaches_its_device_in_bf16(classifier, monkeypatch):
    """Loaded in bf16 for a device, the float32 model never goes there: the copy is made on
    the CPU first."""
    import clearformer.text.cross_encoder as cross_encoder

    placed = []
    real = cross_encoder.place

    def spy(loaded, device):
        placed.append(next(loaded.loaded.model.parameters()).dtype)
        return real(loaded, device)

    monkeypatch.setattr(cross_encoder, "place", spy)
    CrossEncoder.from_pretrained(classifier, precision="bf16", device="cpu")
    assert placed == [torch.bfloat16]


def test_parts_held_in_int8_or_unread_refuse_another_device(bert, monkeypatch):
    import clearformer.text.encoder_files as files_module
    from clearformer.options import Decision
    from clearformer.text.encoder_files import read_encoder_parts

    monkeypatch.setattr(files_module, "check_device", lambda device: torch.device("cuda"))
    options = {"backend": "auto", "strict": True, "padding_side": None, "truncate_dim": None}
    parts = read_encoder_parts(bert, **options)
    with pytest.raises(ValueError, match="precision='int8' runs on CPUs only"):
        TextEncoder.from_parts(parts, held=Decision("int8", "test"), device="cuda")
    deferred = read_encoder_parts(bert, defer_layers=True, **options)
    with pytest.raises(ValueError, match="layers are not read yet"):
        TextEncoder.from_parts(deferred, device="cuda")


def test_int8_model_of_an_encoder_on_another_device_is_refused(bert):
    encoder = TextEncoder.from_pretrained(bert)
    encoder._models._device = lambda: torch.device("cuda")  # as if the model were there
    with pytest.raises(ValueError, match="'int8' runs on CPUs only; this model is on cuda"):
        encoder.int8_model()

"""``precision="auto"`` and the precision names: what auto takes on CPUs described by their
flags (AMX; AVX512-BF16 without AMX, measured or not; VNNI only; plain AVX2), the reason it
gives, the measurement's cache, and bad precision values refused before any work."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.cli import main
from clearformer.cpu import CpuInfo
from clearformer.precision import auto as auto_module
from clearformer.precision import check_precision, speedup
from clearformer.precision.auto import MIN_BF16_SPEEDUP, auto_precision, choose_precision
from clearformer.precision.bf16 import bf16_support

from .helpers import write_tiny_bert

BASE = {"fpu", "sse2", "avx", "avx2", "fma"}
AVX512 = BASE | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
CPUS = {
    # Sapphire Rapids: AMX tiles for bf16 and int8, AVX512-BF16 and VNNI too.
    "amx": AVX512 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"},
    # Zen 4 / Cooper Lake: bf16 dot products without tiles, and VNNI.
    "avx512_bf16": AVX512 | {"avx512_vnni", "avx512_bf16"},
    # Ice Lake / Cascade Lake: int8 dot products only.
    "vnni": AVX512 | {"avx512_vnni"},
    "avx2": BASE,
}


def cpu(kind: str, model: str = "Test CPU") -> CpuInfo:
    return CpuInfo(model, "GenuineIntel", "6 / 143", 2, frozenset(CPUS[kind]))


def never_measured(cpu_info: CpuInfo) -> tuple[float, str]:
    raise AssertionError("the flags settle it: nothing may be measured")


def measured(ratio: float):
    calls = []

    def speedup(cpu_info: CpuInfo) -> tuple[float, str]:
        calls.append(cpu_info)
        return ratio, "measured in the test"

    speedup.calls = calls
    return speedup


# What auto takes, CPU by CPU ---------------------------------------------------------------


def test_amx_takes_bf16_without_measuring():
    decision = auto_precision(cpu("amx"), calibrate=True, speedup=never_measured)
    assert decision.choice == "bf16"
    assert "AMX-BF16" in decision.reason and "0.995" in decision.reason


def test_avx512_bf16_without_amx_is_measured_and_takes_bf16_when_it_pays():
    speedup = measured(MIN_BF16_SPEEDUP + 0.5)
    decision = auto_precision(cpu("avx512_bf16"), calibrate=True, speedup=speedup)
    assert decision.choice == "bf16"
    assert "AVX512-BF16 without AMX" in decision.reason
    assert f"{MIN_BF16_SPEEDUP + 0.5:.2f}x" in decision.reason
    assert "measured in the test" in decision.reason
    assert len(speedup.calls) == 1


def test_avx512_bf16_measured_slow_falls_to_int8_and_says_why():
    speedup = measured(1.05)
    decision = auto_precision(cpu("avx512_bf16"), calibrate=True, speedup=speedup)
    assert decision.choice == "int8"
    assert "only 1.05x" in decision.reason and "avx512_vnni" in decision.reason
    # A caller without int8 (a cross-encoder, generate): float32, with the same why.
    decision = auto_precision(
        cpu("avx512_bf16"), offered=("float32", "bf16"), calibrate=True, speedup=speedup
    )
    assert decision.choice == "float32" and "only 1.05x" in decision.reason


def test_the_switch_skips_the_measurement(monkeypatch):
    monkeypatch.setenv(speedup.SPEEDUP_VARIABLE, "off")
    decision = auto_precision(cpu("avx512_bf16"), speedup=never_measured)
    assert decision.choice == "int8"
    assert "not measured" in decision.reason
    assert speedup.SPEEDUP_VARIABLE in decision.reason
    monkeypatch.setenv(speedup.SPEEDUP_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match=f"{speedup.SPEEDUP_VARIABLE}: expected"):
        auto_precision(cpu("avx512_bf16"), speedup=never_measured)


def test_vnni_only_takes_int8_where_the_caller_runs_it():
    decision = auto_precision(cpu("vnni"), calibrate=True, speedup=never_measured)
    assert decision.choice == "int8" and "avx512_vnni" in decision.reason
    decision = auto_precision(
        cpu("vnni"), offered=("float32", "bf16"), calibrate=True, speedup=never_measured
    )
    assert decision.choice == "float32" and "no AMX-BF16" in decision.reason


def test_plain_avx2_takes_float32():
    decision = auto_precision(cpu("avx2"), calibrate=True, speedup=never_measured)
    assert decision.choice == "float32"
    assert "no AMX-BF16, AVX512-BF16 or int8 dot products" in decision.reason
    unread = CpuInfo("unknown", "", "", 1, frozenset())
    decision = auto_precision(unread, calibrate=True, speedup=never_measured)
    assert decision.choice == "float32" and "could not be read" in decision.reason


def test_bf16_support_reads_the_flags():
    assert bf16_support(cpu("amx")).tiles and bf16_support(cpu("amx")).native
    assert not bf16_support(cpu("avx512_bf16")).tiles and bf16_support(cpu("avx512_bf16")).native
    arm = CpuInfo("Neoverse-V1", "", "65 / 0xd40", 2, frozenset({"asimd", "bf16", "asimddp"}))
    assert bf16_support(arm).native and not bf16_support(arm).tiles
    assert not bf16_support(cpu("vnni")).native and not bf16_support(cpu("avx2")).native


def test_choose_precision_by_name_and_off_the_cpu():
    assert choose_precision("bfloat16", cpu=cpu("amx")).choice == "bf16"
    assert choose_precision("float32").choice == "float32"
    slow = choose_precision("bf16", cpu=cpu("avx2"))
    assert slow.choice == "bf16" and "emulated" in slow.reason  # asked for: it runs
    off_cpu = choose_precision("auto", device="meta", cpu=cpu("amx"))
    assert off_cpu.choice == "float32" and "meta" in off_cpu.reason


def test_auto_on_this_machine_names_a_precision_and_a_reason(monkeypatch):
    monkeypatch.setenv(speedup.SPEEDUP_VARIABLE, "off")
    decision = choose_precision("auto")
    assert decision.choice in ("float32", "bf16", "int8") and decision.reason


# The measurement and its cache -------------------------------------------------------------


def test_the_measurement_is_cached_per_cpu_model_and_torch_version(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    zen = cpu("avx512_bf16", "AMD EPYC 9R14")
    ratio, source = speedup.bf16_speedup(zen, measure=lambda: 1.75)
    assert ratio == 1.75 and "measured now" in source
    path = speedup.cache_path(zen)
    # One store for every measured verdict: the kernels' and this one.
    assert path.parent == tmp_path / "calibration" and str(path) in source
    record = json.loads(path.read_text())
    assert record["verdicts"][speedup.CHOICE]["speedups"]["bf16"] == 1.75
    assert record["key"]["cpu"].startswith("AMD EPYC 9R14")
    assert record["key"]["torch"] == torch.__version__
    # The atomic write leaves no temporary file behind.
    assert [p.name for p in path.parent.iterdir()] == [path.name]

    def must_not_measure() -> float:
        raise AssertionError("cached: nothing to measure")

    ratio, source = speedup.bf16_speedup(zen, measure=must_not_measure)
    assert ratio == 1.75 and "measured earlier" in source
    # Another CPU model, another PyTorch: another file.
    other = cpu("avx512_bf16", "Intel Xeon Cooper Lake")
    assert speedup.cache_path(other) != path
    assert speedup.cache_path(zen, torch_version="0.0.1") != path
    assert speedup.bf16_speedup(other, measure=lambda: 0.9)[0] == 0.9


@pytest.mark.parametrize("damage", ["{not json", b"\xff\xfe not UTF-8", "A STRING SPEEDUP"])
def test_a_damaged_cache_is_measured_again(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    zen = cpu("avx512_bf16")
    path = speedup.cache_path(zen)
    if damage == "A STRING SPEEDUP":  # the right file, "1.6" where a number belongs
        speedup.bf16_speedup(zen, measure=lambda: 1.6)
        damage = path.read_text().replace('"bf16": 1.6', '"bf16": "1.6"')
        assert '"1.6"' in damage
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    assert speedup.bf16_speedup(zen, measure=lambda: 1.5)[0] == 1.5
    assert json.loads(path.read_text())["verdicts"][speedup.CHOICE]["speedups"]["bf16"] == 1.5


def test_a_cache_that_cannot_be_written_costs_a_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CLEARFORMER_CACHE", str(blocker))  # a directory cannot be made in it
    with caplog.at_level(logging.WARNING, logger="clearformer.precision.speedup"):
        ratio, source = speedup.bf16_speedup(cpu("avx512_bf16"), measure=lambda: 1.4)
    assert ratio == 1.4 and "not cached" in source
    assert "could not cache" in caplog.text


def test_the_measurement_times_both_dtypes():
    ratio = speedup.measure_bf16_speedup((8, 16, 16), repeats=1)
    assert np.isfinite(ratio) and ratio > 0


def test_auto_reads_the_cached_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    zen = cpu("avx512_bf16")
    speedup.bf16_speedup(zen, measure=lambda: MIN_BF16_SPEEDUP + 1.0)
    decision = auto_precision(zen, calibrate=True)
    assert decision.choice == "bf16" and "cached in" in decision.reason


# The applications: auto with mocked flags, bad values before any work ----------------------

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(40))]
TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10", "w11 w12"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-auto"), WORDS, n_layers=2)


@pytest.mark.parametrize(("kind", "want"), [("amx", "bf16"), ("avx2", "float32")])
def test_encode_auto_runs_what_auto_takes_and_logs_it(tiny, monkeypatch, caplog, kind, want):
    monkeypatch.setattr(auto_module, "cpu_info", lambda: cpu(kind))
    monkeypatch.setattr("clearformer.precision.bf16.cpu_info", lambda: cpu(kind))
    encoder = TextEncoder.from_pretrained(tiny)
    decision = encoder.precision_for("auto")
    assert decision.choice == want
    with caplog.at_level(logging.INFO, logger="clearformer.text"):
        got = encoder.encode(TEXTS, precision="auto")
    assert f"in {want}" in caplog.text
    np.testing.assert_array_equal(got, encoder.encode(TEXTS, precision=want))
    if want == "bf16":  # and the bf16 rows are not the float32 ones (the copy really ran)
        assert np.abs(got - encoder.encode(TEXTS)).max() > 0


def test_bad_precision_values_are_refused_before_any_work(tiny, monkeypatch):
    encoder = TextEncoder.from_pretrained(tiny)

    def no_work(*args, **kwargs):
        raise AssertionError("tokenized before the precision was checked")

    monkeypatch.setattr(encoder.tokenizer, "encode", no_work)
    with pytest.raises(ValueError, match=r"precision must be one of .*'bf16'.*got 'fp16'"):
        encoder.encode(TEXTS, precision="fp16")
    with pytest.raises(TypeError, match="precision must be one of"):
        encoder.encode(TEXTS, precision=torch.bfloat16)
    with pytest.raises(ValueError, match="precision must be one of"):
        encoder.embed_batch([], normalize=True, precision="half")
    with pytest.raises(ValueError, match="precision must be one of"):
        encoder.precision_for("int4")


def test_check_precision_names_the_argument_and_the_alias():
    assert check_precision("bfloat16") == "bf16"
    with pytest.raises(ValueError) as caught:
        check_precision("BF16", "--precision", ("float32", "bf16", "auto"))
    message = str(caught.value)
    assert "--precision must be one of ('float32', 'bf16', 'auto', 'bfloat16')" in message
    assert "got 'BF16'" in message
    with pytest.raises(ValueError, match="got 'int8'"):
        check_precision("int8", "precision", ("float32", "bf16", "auto"))


@pytest.mark.parametrize(
    ("argv", "bad"),
    [
        (["encode", "--precision", "fp16", "x"], "'fp16'"),
        (["search", "q", "--corpus", "c.txt", "--precision", "half"], "'half'"),
        (["rerank", "q", "--corpus", "c.txt", "--model", "m", "--precision", "int8"], "'int8'"),
        (["generate", "3 4", "--run", "r", "--precision", "int8"], "'int8'"),
    ],
)
def test_the_cli_refuses_a_bad_precision_in_one_line(capsys, argv, bad):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"--precision: invalid choice: {bad}" in err and "Traceback" not in err


def test_the_cli_help_lists_bf16_and_auto(capsys):
    for command in ("encode", "search", "rerank", "generate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "bf16" in out and "bfloat16" in out and "auto" in out, command

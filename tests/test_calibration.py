"""Routes chosen by measurement (clearformer.calibration): the verdict logic on the test's
own clock (a winner, a tie within the margin, a loss), the cache (round trip, atomic, a
damaged file ignored with a warning, the XDG folder), ``auto`` reading an injected verdict and
naming it in the plan, the AVX-512 workloads computing the same values on both sides, and
``clearformer calibrate``. Nothing here times real work: the suite runs with calibration off
(conftest), and these tests inject the verdicts they need."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from clearformer.calibration import cache
from clearformer.calibration.measure import Verdict, Workload, measure_choice
from clearformer.cli import main
from clearformer.fast import avx512
from clearformer.machine import cache_folder
from clearformer.routes import kernel_route

from .helpers import needs_avx512_library


class FakeClock:
    """A clock that moves only when a candidate runs, by the candidate's set cost."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def runs(self, costs: dict[str, float]) -> dict:
        def make(name, cost):
            def run():
                self.calls.append(name)
                self.now += cost

            return run

        return {name: make(name, cost) for name, cost in costs.items()}


def verdict_of(costs: list[dict[str, float]], margin: float = 0.05, rounds: int = 3) -> Verdict:
    clock = FakeClock()
    workloads = [Workload(f"w{i}", clock.runs(c)) for i, c in enumerate(costs)]
    return measure_choice(
        "k", workloads, baseline="torch", rounds=rounds, margin=margin, clock=clock
    )


def test_a_decisively_faster_candidate_wins_by_its_geometric_mean():
    verdict = verdict_of([{"torch": 0.02, "avx512": 0.01}, {"torch": 0.01, "avx512": 0.02 / 3}])
    assert verdict.winner == "avx512"
    assert verdict.speedups["avx512"] == pytest.approx((2 * 1.5) ** 0.5)
    assert verdict.speedups["torch"] == 1
    assert verdict.reason == "avx512 measured 1.73x torch's"
    assert verdict.seconds["w0"] == pytest.approx({"torch": 0.02, "avx512": 0.01})


def test_a_tie_within_the_margin_or_a_loss_keeps_the_baseline():
    tie = verdict_of([{"torch": 0.0103, "avx512": 0.01}])
    assert tie.winner == "torch" and "within the 5% margin" in tie.reason
    loss = verdict_of([{"torch": 0.0089, "avx512": 0.01}])
    assert loss.winner == "torch" and loss.reason == "avx512 measured slower: 0.89x torch's"
    # the same tie with no margin is a win: the margin decided
    assert verdict_of([{"torch": 0.0103, "avx512": 0.01}], margin=0.0).winner == "avx512"


def test_the_candidates_alternate_and_no_one_always_goes_first():
    clock = FakeClock()
    measure_choice(
        "k",
        [Workload("w", clock.runs({"torch": 0.01, "avx512": 0.01}))],
        baseline="torch",
        rounds=3,
        clock=clock,
    )
    # one untimed call each, then rounds in alternating order
    assert clock.calls == [
        "torch",
        "avx512",
        "torch",
        "avx512",
        "avx512",
        "torch",
        "torch",
        "avx512",
    ]


def test_a_short_call_is_repeated_until_its_sample_is_long_enough():
    clock = FakeClock()
    measure_choice(
        "k",
        [Workload("w", clock.runs({"torch": 0.001, "avx512": 0.01}))],
        baseline="torch",
        rounds=1,
        clock=clock,
    )
    assert clock.calls.count("torch") == 1 + 5 and clock.calls.count("avx512") == 2


@pytest.mark.parametrize(
    "workloads, message",
    [
        ([], "needs at least one workload"),
        ([Workload("w", {"torch": print})], "two or more candidates"),
        ([Workload("w", {"a": print, "b": print})], "expected a baseline 'torch'"),
        (
            [Workload("w", {"torch": print, "x": print}), Workload("v", {"torch": print})],
            "workload 'v' has candidates",
        ),
    ],
)
def test_bad_workloads_are_refused_before_any_timing(workloads, message):
    with pytest.raises(ValueError, match=message):
        measure_choice("k", workloads, baseline="torch")


def a_key() -> cache.CalibrationKey:
    return cache.CalibrationKey("Test CPU (family 1 / 2)", "2.0", "0.1.0", "abc")


def test_verdicts_round_trip_through_an_atomic_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    verdict = verdict_of([{"torch": 0.02, "avx512": 0.01}])
    path = cache.write(a_key(), {"k": verdict})
    assert path.parent == tmp_path / "calibration"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert cache.read(a_key()) == {"k": verdict}
    other = cache.CalibrationKey("Test CPU (family 1 / 2)", "2.1", "0.1.0", "abc")
    assert other.path() != path and cache.read(other) is None  # another torch: not measured


def test_the_cache_folder_follows_xdg_unless_clearformer_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("CLEARFORMER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "clearformer"
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path / "own"))
    assert cache_folder() == tmp_path / "own"


def test_a_cache_file_is_named_from_the_setting_that_chose_the_folder(tmp_path, monkeypatch):
    # A plan's reason or an explain report travels: it names no folder of this machine.
    for variable in ("CLEARFORMER_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    file = cache_folder() / "calibration" / "verdicts-1.json"
    assert cache.shown(file) == "~/.cache/clearformer/calibration/verdicts-1.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    file = cache_folder() / "calibration" / "verdicts-1.json"
    assert cache.shown(file) == "$XDG_CACHE_HOME/clearformer/calibration/verdicts-1.json"
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path / "own"))
    file = cache_folder() / "calibration" / "verdicts-1.json"
    assert cache.shown(file) == "$CLEARFORMER_CACHE/calibration/verdicts-1.json"
    assert cache.shown(tmp_path / "elsewhere" / "verdicts-1.json") == "verdicts-1.json"


@pytest.mark.parametrize(
    "damage",
    [
        "{ not json",
        json.dumps({"format": 99}),
        json.dumps({"format": 1, "key": {"cpu": "another"}, "verdicts": {}}),
        "KEY",  # the right key, a verdict with a field missing
        b'{"format": 1, "key": "\xff\xfe"}',  # not UTF-8
    ],
)
def test_a_damaged_file_is_ignored_with_a_warning_and_rebuilt(
    tmp_path, monkeypatch, caplog, damage
):
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    key = a_key()
    key.path().parent.mkdir(parents=True)
    if damage == "KEY":
        from dataclasses import asdict

        damage = json.dumps({"format": 1, "key": asdict(key), "verdicts": {"k": {"winner": 1}}})
    if isinstance(damage, bytes):
        key.path().write_bytes(damage)
    else:
        key.path().write_text(damage)
    with caplog.at_level(logging.WARNING, logger="clearformer.calibration.cache"):
        assert cache.read(key) is None
    assert "damaged" in caplog.text and str(key.path()) in caplog.text
    verdict = verdict_of([{"torch": 0.02, "avx512": 0.01}])
    cache.write(key, {"k": verdict})  # the next measurement replaces it
    assert cache.read(key) == {"k": verdict}


@pytest.mark.parametrize(
    "field, value",
    [
        ("speedups", {"torch": 1.0, "avx512": "1.6"}),  # a string, compared and printed later
        ("speedups", {"torch": 1.0, "avx512": True}),
        ("speedups", {"torch": 1.0, "avx512": float("nan")}),
        ("speedups", {"torch": 1.0, "avx512": float("inf")}),
        ("speedups", {"torch": 1.0, "avx512": None}),
        ("seconds", {"w0": {"torch": "0.02", "avx512": 0.01}}),
        ("seconds", {"w0": 0.02}),
        ("seconds", {"w0": {"torch": 0.02}}),  # a candidate's time missing
        ("margin", True),
        ("rounds", True),
        ("baseline", "oneDNN"),  # no speedup of its own
    ],
)
def test_a_verdict_whose_numbers_cannot_be_used_is_damaged(
    tmp_path, monkeypatch, caplog, field, value
):
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    written = verdict_of([{"torch": 0.02, "avx512": 0.01}]).to_dict()
    with pytest.raises(ValueError, match=field):
        Verdict.from_dict({**written, field: value})
    key = a_key()
    cache.write(key, {"k": Verdict.from_dict(written)})
    record = json.loads(key.path().read_text())
    record["verdicts"]["k"][field] = value
    key.path().write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="clearformer.calibration.cache"):
        assert cache.read(key) is None
    assert "damaged" in caplog.text


class TestAutoReadsTheVerdict:
    pytestmark = needs_avx512_library

    def test_auto_takes_a_kernel_measured_faster_and_names_the_measurement(self, measured):
        from clearformer import Encoder, EncoderConfig

        path = measured(avx512_attention=1.2, avx512_linear=0.89)
        route = kernel_route("avx512_attention")
        assert route.choice == "avx512"
        assert "avx512 measured 1.20x torch's on" in route.reason
        # The file, named from the setting that chose the folder: no folder of this machine.
        assert f"cached $CLEARFORMER_CACHE/calibration/{path.name}" in route.reason
        assert str(path.parent) not in route.reason
        linear = kernel_route("avx512_linear")
        assert linear.choice == "torch" and "measured slower: 0.89x" in linear.reason
        torch.manual_seed(0)
        encoder = Encoder(EncoderConfig(d_model=64, n_heads=2, n_layers=1, dim_mlp=128)).eval()
        mask = torch.arange(20) < torch.tensor([20, 5, 9])[:, None]
        with torch.no_grad():
            plan = encoder.plan_for(mask, backend="varlen")
        assert plan.method.choice == "avx512" and "measured 1.20x" in str(plan)
        assert "PyTorch's route (AVX-512 linear: avx512 measured slower: 0.89x" in str(plan)

    def test_no_verdict_keeps_pytorchs_route_and_says_how_to_measure(self, measured):

        route = kernel_route("avx512_attention")
        assert route.choice == "torch" and "clearformer calibrate" in route.reason

    def test_a_verdict_measured_slower_keeps_pytorchs_route(self, measured):

        measured(avx512_attention=0.89, avx512_linear=1.0)
        assert kernel_route("avx512_attention").choice == "torch"
        linear = kernel_route("avx512_linear")
        assert linear.choice == "torch" and "within the 5% margin" in linear.reason

    def test_calibrate_show_prints_the_verdicts_and_auto_s_choice(self, measured, capsys):
        assert main(["calibrate", "--show"]) == 1  # nothing cached yet
        assert "no verdicts cached" in capsys.readouterr().out
        measured(avx512_attention=1.5, avx512_linear=0.5)
        assert main(["calibrate", "--show"]) == 0
        out = capsys.readouterr().out
        assert "| avx512_attention | 1.50x | avx512 | avx512 (" in out
        assert "| avx512_linear | 0.50x | torch | torch (" in out
        assert "| w0 | 15.00 | 10.00 |" in out

    def test_calibrating_says_so_and_counts_its_workloads(self, measured, monkeypatch, capsys):
        # `clearformer serve`'s first start measures for seconds: the command line says what
        # it is doing and how far it is, from the calibration's own progress records.
        from clearformer.calibration import kernels

        def workloads(*names):
            return [
                Workload(name, {"torch": lambda: None, "avx512": lambda: None}) for name in names
            ]

        monkeypatch.setattr(kernels, "attention_workloads", lambda dtype=None: workloads("a", "b"))
        monkeypatch.setattr(kernels, "linear_workloads", lambda few_rows=(): workloads("c"))
        monkeypatch.setattr(kernels, "flash_workloads", lambda dtype: workloads("d"))
        monkeypatch.setattr(kernels, "dropout_workloads", lambda: workloads("e"))
        # The bfloat16 flash kernel is measured only on a CPU with AVX512-BF16.
        flash = avx512.FLASH_BF16 in avx512.kernels_here()
        count, total = (7, 9) if flash else (6, 8)
        assert main(["calibrate", "--force"]) == 0
        said = [
            line.removeprefix("clearformer calibrate: ")
            for line in capsys.readouterr().err.splitlines()
            if line.startswith("clearformer calibrate: calibrating")
        ]
        assert said[0] == (
            f"calibrating kernels for this CPU (once per machine): {count} kernels against "
            f"PyTorch's routes, {total} workloads..."
        )
        counts = [line.split(", ")[0] for line in said[1:]]
        assert counts == [f"calibrating: {done}/{total} workloads" for done in range(1, total + 1)]
        assert all(" workloads/s" in line for line in said[1:])
        assert all(", ETA " in line for line in said[1:-1]) and ", ETA" not in said[-1]

    def test_both_sides_of_every_workload_compute_the_same_values(self):
        from clearformer.calibration.kernels import (
            attention_workloads,
            flash_workloads,
            linear_workloads,
        )

        # bfloat16 rows: both sides compute in float32 and round once, one bfloat16 step
        # (2^-8 of the value) apart at most.
        tolerances = {torch.float32: {"atol": 5e-5, "rtol": 1e-4}}
        tolerances[torch.bfloat16] = {"atol": 1e-2, "rtol": 2**-7}
        workloads = attention_workloads() + linear_workloads()
        workloads += linear_workloads(few_rows=(10, 40))
        workloads += attention_workloads(torch.bfloat16) + flash_workloads(torch.float32)
        if avx512.FLASH_BF16 in avx512.kernels_here():
            workloads += flash_workloads(torch.bfloat16)
        with torch.inference_mode():
            for workload in workloads:
                got = workload.runs["avx512"]()
                want = workload.runs["torch"]()
                assert got.dtype == want.dtype, workload.name
                tolerance = tolerances[got.dtype]
                torch.testing.assert_close(got, want, **tolerance, msg=workload.name)
                assert got.abs().max() > 0.1  # not two zeros that agree


def test_calibrate_refuses_force_with_show(capsys):
    assert main(["calibrate", "--force", "--show"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_nothing_is_measured_where_calibration_is_off(monkeypatch):
    from clearformer.calibration import kernels

    monkeypatch.setattr(kernels, "calibrate", lambda **_: pytest.fail("measured"))
    assert kernels.measure_if_missing() is None  # the suite's CLEARFORMER_CALIBRATION=off

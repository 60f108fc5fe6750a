"""The precisions a text application (``TextEncoder``, ``CrossEncoder``) runs: each call's
decision, and the bfloat16 copy of its model, made once and kept.

A decision depends on the precision asked for and the machine, never on the texts: each one is
made on the application's first call that asks for it (``auto`` may measure once per CPU
model, :mod:`clearformer.precision.speedup`) and reused by the later calls, so a server
that calls once per batch does not decide again per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

from ..options import Decision
from ..precision import check_precision

log = logging.getLogger(__name__)

Model = TypeVar("Model")


def held_precision(
    precision: str | None, offered: tuple[str, ...], device: torch.device | None = None
) -> tuple[Decision | None, str | None]:
    """For a load with ``precision=`` (None: no precision held) onto ``device`` (None: the
    CPU): the decision it holds and the canonical name it asked for, checked and decided before
    any weight is read."""
    if precision is None:
        return None, None
    from ..precision import choose_precision

    asked = check_precision(precision, "precision", (*offered, "auto"))
    where = torch.device("cpu") if device is None else device
    decision = choose_precision(asked, device=where, offered=offered)
    if decision.choice not in (asked, "auto") and asked != "auto":
        # A name that runs as another (int8 without int8 products, int8-blocks without its
        # kernel): the load holds the other model, and says so once here.
        log.warning("precision %s runs as %s: %s", asked, decision.choice, decision.reason)
    return decision, asked


class Precisions(Generic[Model]):
    """Per application: the precision decided for each name asked, and the bfloat16 copy.

    Args:
        offered: the precisions the application runs (``auto`` picks among them).
        device: where its model lives (``auto`` decides per device:
            :func:`clearformer.precision.choose_precision`).
        copy_bf16: builds the bfloat16 copy of the application's model(s), on first need.
        copy_int8_blocks: builds its int8-blocks model(s), on first need (None: not offered).
    """

    def __init__(
        self,
        offered: tuple[str, ...],
        device: Callable[[], torch.device],
        copy_bf16: Callable[[], Model],
        held: Decision | None = None,
        held_as: str | None = None,
        copy_int8_blocks: Callable[[], Model] | None = None,
    ) -> None:
        self.offered = offered
        self._device = device
        self._copies = {"bf16": copy_bf16, "int8-blocks": copy_int8_blocks}
        self._built: dict[str, Model] = {}  # precision -> its copy, built once
        self._decisions: dict[str, Decision] = {}
        self._lock = threading.Lock()
        self.held = held
        # The name the load asked for: int8 asked where the CPU has no int8 runs float32, and
        # a call that asks for int8 again runs what the load decided.
        self.held_as = held_as if held_as is not None or held is None else held.choice
        if held is not None:  # one model, loaded in its precision: every call runs it
            own = held
            if self.held_as != held.choice:  # held.reason says why the asked name runs as this
                reason = f"the precision this model was loaded in: {held.reason}"
                own = Decision(held.choice, reason)
            self._decisions = {held.choice: own, "auto": held, self.held_as: held}

    @property
    def default(self) -> str:
        """What a call that names no precision runs: the held one, else float32."""
        return "float32" if self.held is None else self.held.choice

    def check(self, precision: object, name: str = "precision") -> str:
        """``precision``'s canonical name (None: :attr:`default`), or the argument error
        (before any work). An application loaded in one precision runs that one alone."""
        if precision is None:
            return self.default
        precision = check_precision(precision, name, (*self.offered, "auto"))
        if self.held is not None and precision not in (self.held.choice, self.held_as, "auto"):
            runs = "" if self.held_as == self.held.choice else f", run as {self.held.choice}"
            allowed = " or ".join(
                repr(p) for p in dict.fromkeys((self.held_as, self.held.choice, "auto"))
            )
            raise ValueError(
                f"{name} must be {allowed}: this model was loaded with "
                f"precision={self.held_as!r}{runs} and holds that model alone; load it "
                f"without precision= to choose per call, got {precision!r}"
            )
        return precision

    def decide(self, precision: str) -> Decision:
        """What a call asking for ``precision`` (a checked name) runs in, and why."""
        from ..precision import choose_precision

        decision = self._decisions.get(precision)
        if decision is None:
            decision = choose_precision(precision, device=self._device(), offered=self.offered)
            self._decisions[precision] = decision
            # A name that runs as another (int8 without int8 instructions) is worth a warning.
            level = logging.INFO if precision in ("auto", decision.choice) else logging.WARNING
            log.log(level, "precision %s: %s (%s)", precision, decision.choice, decision.reason)
        return decision

    def bf16(self) -> Model:
        """The bfloat16 copy, built on the first call (a few hundred milliseconds for the
        bundled model) and returned by every later one."""
        return self._once("bf16", "the bfloat16 model")

    def int8_blocks(self) -> Model:
        """The int8-blocks model(s), built on the first call and returned by every later one;
        refused (before any work) where the model is not on the CPU."""
        self.cpu_only("int8-blocks")
        return self._once("int8-blocks", "the int8-blocks model")

    def cpu_only(self, precision: str) -> None:
        """``precision`` (an int8 one) is this application's to run, and its model is on the
        CPU, or the argument error."""
        self.check(precision)
        if self._device().type != "cpu":
            raise ValueError(
                f"precision={precision!r} runs on CPUs only; this model is on {self._device()}"
            )

    def _once(self, precision: str, what: str) -> Model:
        with self._lock:
            if precision not in self._built:
                started = time.perf_counter()
                self._built[precision] = self._copies[precision]()
                log.info("built %s in %.2fs", what, time.perf_counter() - started)
            return self._built[precision]

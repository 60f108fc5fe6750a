"""The environment switches of the kernels clearformer builds itself, read in one place.

clearformer compiles code of its own in two places: the AVX-512 library (an attention kernel
and a linear kernel, :mod:`clearformer.fast.avx512`) and the int8 layers' element-wise steps,
compiled by ``torch.compile`` (:mod:`clearformer.quant.fused`). Each has a PyTorch route that
computes the same values; these switches choose between them for ``auto``:

``CLEARFORMER_KERNELS``        ``off``: none of clearformer's kernels runs, a library already
                               built and loaded included; every call takes PyTorch's route,
                               and a kernel named explicitly (``method="avx512"``) is refused.
                               The one switch for an A/B against PyTorch.
``CLEARFORMER_AVX512``         the AVX-512 library (attention and linear) as ``auto`` sees it
                               (a kernel named explicitly still runs): ``off``; ``on``:
                               taken wherever it serves the call, unmeasured (for tests and
                               A/B runs); ``auto`` (the default): taken where this CPU measured
                               it faster (:mod:`clearformer.calibration`).
``CLEARFORMER_AVX512_ATTENTION``, ``CLEARFORMER_AVX512_LINEAR``, ``CLEARFORMER_AVX512_DROPOUT``
                               one kernel of the library alone (``on``, ``off``, ``auto``);
                               unset, it follows ``CLEARFORMER_AVX512`` (an A/B of one kernel).
                               The attention switch covers its float32 and bfloat16 rows and
                               the bfloat16 flash kernel.
``CLEARFORMER_CALIBRATION``    ``off``: nothing is measured and no cached verdict is read, so
                               ``auto`` keeps PyTorch's routes (the test suite runs so).

``off`` at any level wins (``CLEARFORMER_KERNELS=off`` turns everything off,
``CLEARFORMER_AVX512=off`` the linear kernel too); otherwise the most specific setting does.
They are read on every decision (an environment lookup, not a cached value), so a process can
switch between calls; an unknown value is an error that names the variable.
"""

from __future__ import annotations

import os

from .options import Decision

KERNELS_VARIABLE = "CLEARFORMER_KERNELS"
AVX512_VARIABLE = "CLEARFORMER_AVX512"
AVX512_ATTENTION_VARIABLE = "CLEARFORMER_AVX512_ATTENTION"
AVX512_LINEAR_VARIABLE = "CLEARFORMER_AVX512_LINEAR"
AVX512_DROPOUT_VARIABLE = "CLEARFORMER_AVX512_DROPOUT"
CALIBRATION_VARIABLE = "CLEARFORMER_CALIBRATION"

# The kernels a switch names, and the variables that apply to each, most specific first.
KERNEL_VARIABLES = {
    "avx512_attention": (AVX512_ATTENTION_VARIABLE, AVX512_VARIABLE),
    # The same kernel on bfloat16 rows: one switch, a verdict of its own (clearformer.fast.avx512).
    "avx512_attention_bf16": (AVX512_ATTENTION_VARIABLE, AVX512_VARIABLE),
    "avx512_linear": (AVX512_LINEAR_VARIABLE, AVX512_VARIABLE),
    # The same kernel on a sentence's few rows: one switch, a verdict of its own.
    "avx512_linear_rows": (AVX512_LINEAR_VARIABLE, AVX512_VARIABLE),
    # The flash kernels (float32, bfloat16): attention too, under the attention switch.
    "avx512_flash": (AVX512_ATTENTION_VARIABLE, AVX512_VARIABLE),
    "avx512_flash_bf16": (AVX512_ATTENTION_VARIABLE, AVX512_VARIABLE),
    # Dropout's masks from a counter-based generator (training only).
    "avx512_dropout": (AVX512_DROPOUT_VARIABLE, AVX512_VARIABLE),
    "int8_steps": (),
}
SETTINGS = ("on", "off", "auto")
_SPELLINGS = {
    "": None,  # unset: the next variable decides
    "auto": "auto",
    "on": "on",
    "1": "on",
    "true": "on",
    "yes": "on",
    "off": "off",
    "0": "off",
    "false": "off",
    "no": "off",
}


def read(variable: str) -> str | None:
    """``on``, ``off`` or ``auto`` as ``variable`` says, None where it is unset or empty."""
    value = os.environ.get(variable, "").strip().lower()
    if value not in _SPELLINGS:
        raise ValueError(
            f"{variable}: expected 'on', 'off' or 'auto', got {os.environ[variable]!r}"
        )
    return _SPELLINGS[value]


def all_off() -> Decision | None:
    """``Decision("off", reason)`` where ``CLEARFORMER_KERNELS=off``, else None: then even a
    kernel named explicitly is refused."""
    if read(KERNELS_VARIABLE) == "off":
        return Decision("off", f"{KERNELS_VARIABLE}=off turns every clearformer kernel off")
    return None


def kernel_setting(kernel: str) -> Decision:
    """``Decision("on" | "off" | "auto", reason)`` for one of :data:`KERNEL_VARIABLES`."""
    if kernel not in KERNEL_VARIABLES:
        raise ValueError(f"kernel: expected one of {sorted(KERNEL_VARIABLES)}, got {kernel!r}")
    off = all_off()
    if off is not None:
        return off
    settings = [
        (variable, read(variable)) for variable in (*KERNEL_VARIABLES[kernel], KERNELS_VARIABLE)
    ]
    for variable, setting in settings:
        if setting == "off":
            return Decision("off", f"{variable}=off")
    for variable, setting in settings:
        if setting is not None:
            return Decision(setting, f"{variable}={setting}")
    return Decision("auto", "no switch set")


def calibration_enabled() -> bool:
    """Whether ``auto`` may measure and read measured verdicts (``CLEARFORMER_CALIBRATION``
    not ``off``)."""
    return read(CALIBRATION_VARIABLE) != "off"

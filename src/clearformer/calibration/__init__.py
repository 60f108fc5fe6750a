"""Routes chosen by measurement: a named choice between candidate callables, timed on this
CPU (:mod:`.measure`), its verdict cached per CPU model and software (:mod:`.cache`).

:mod:`.kernels` measures clearformer's AVX-512 kernels against PyTorch's routes
(``clearformer calibrate``); :func:`clearformer.routes.kernel_route` reads the verdicts.
This package's root imports only the generic parts, so the fast paths can read verdicts
without importing the workloads that exercise them.
"""

from .cache import CalibrationKey, cached_verdicts
from .measure import MARGIN, Verdict, Workload, measure_choice

__all__ = [
    "MARGIN",
    "CalibrationKey",
    "Verdict",
    "Workload",
    "cached_verdicts",
    "measure_choice",
]

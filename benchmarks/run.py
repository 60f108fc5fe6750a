"""Run the benchmark suite: ``python benchmarks/run.py [clearformer bench options]``.

The suite itself lives in ``clearformer.bench`` (so ``clearformer bench`` runs the same code);
results land in a new ``bench-results/<date>-<time>/`` folder by default; replacing the
committed results is explicit. Examples::

    python benchmarks/run.py --quick
    python benchmarks/run.py                      # full run (about 15 minutes on 2 cores)
    python benchmarks/run.py --out benchmarks/results --force   # replace files of the same name
"""

import sys

from clearformer.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

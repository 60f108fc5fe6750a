"""The model card (``README.md``) of a model trained by the ``contrastive`` task: what it was
trained from and on, how, and its evaluation before and after, read from the run folder."""

from __future__ import annotations

import json
from pathlib import Path

from ...io import atomic_write


def _evaluations(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in records if any(k.startswith("eval_") for k in r)]


def write_model_card(out: Path, task, run_dir: Path, weights_from: str) -> None:
    config = task.config
    evaluations = _evaluations(run_dir)
    lines = [
        "---",
        "library_name: sentence-transformers",
        "tags: [sentence-transformers, feature-extraction, sentence-similarity, clearformer]",
        "---",
        "",
        f"# {out.name}: fine-tuned from {task.parts.loaded.files.path.name}",
        "",
        "Trained with `clearformer train --task contrastive` (in-batch and hard negatives, "
        f"cosine x {config.scale:g}, cross-entropy"
        + (", symmetric" if config.symmetric else "")
        + (f", Matryoshka widths {list(task.dims)}" if task.dims else "")
        + ").",
        "",
        "| | |",
        "| --- | --- |",
        f"| base model | `{task.parts.loaded.files.path}` |",
        f"| training rows | {len(task.train_pairs):,} from `{config.train_file}` |",
        f"| hard negatives | {sum(len(task._negatives(p)) for p in task.train_pairs):,} |",
        f"| steps x batch | {config.steps} x {config.batch_size}"
        + (
            f" (GradCache mini-batches of {config.mini_batch_size})"
            if config.mini_batch_size
            else ""
        )
        + " |",
        f"| learning rate | {config.lr:g}, {config.warmup_steps} warm-up steps, "
        f"{config.decay} decay |",
        f"| precision | {config.precision} |",
        f"| max length | {task.tokenizer.max_length} tokens |",
        f"| weights | {weights_from} |",
    ]
    if config.query_prompt or config.document_prompt:
        lines.append(
            f"| prompts | query {config.query_prompt!r}, document {config.document_prompt!r} |"
        )
    if evaluations:
        names = [k for k in evaluations[0] if k.startswith("eval_")]
        where = (
            f"{task.eval_data.folder} (split {task.eval_data.split})"
            if task.eval_data is not None
            else "held-out rows"
        )
        lines += [
            "",
            f"## Evaluation on {where}",
            "",
            "| step | " + " | ".join(n.removeprefix("eval_") for n in names) + " |",
            "| ---: | " + " | ".join("---:" for _ in names) + " |",
        ]
        for record in evaluations:
            values = " | ".join(f"{record[n]:.4f}" for n in names if n in record)
            lines.append(f"| {record['step']} | {values} |")
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer  # or clearformer.TextEncoder",
        "",
        f'model = SentenceTransformer("{out}")',
        "```",
        "",
    ]
    with atomic_write(out / "README.md") as f:
        f.write("\n".join(lines))

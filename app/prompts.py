"""The Spec-Bench prompts shipped in assets/spec_bench/ (or another file of that format): the bench's workload,
the web app's examples, the training recipes' acceptance check."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "spec_bench" / "question.jsonl"


def load_prompts(path: str | None, categories: list[str] | None, limit: int | None) -> list[dict]:
    """First turns of a Spec-Bench-format JSONL file; `limit` applies per category, in file order."""
    path = Path(path) if path else DEFAULT_PROMPTS
    rows, taken = [], defaultdict(int)
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            cat = q["category"]
            if categories and cat not in categories:
                continue
            if limit is not None and taken[cat] >= limit:
                continue
            taken[cat] += 1
            rows.append({"id": q["question_id"], "category": cat, "text": q["turns"][0]})
    if not rows:
        raise ValueError(f"no prompts selected from {path} (categories={categories})")
    return rows

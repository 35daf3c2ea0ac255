"""Autoregressive in the web app: the baseline, nothing drafted."""

from __future__ import annotations

RECORDING = 'the baseline: one target pass per token, nothing drafted.'
LEARN = """\
### Autoregressive (the baseline)
One target pass per token: feed the last token, pick the next (argmax, or a sample), append, repeat.
Nothing is drafted, so τ = 1 token per pass, and every other mode is measured against this one:
same prompt, same sampling settings, tokens per second compared.

**Parameters:** only generation settings (`max_new_tokens`, temperature, top-k / top-p, seed).
TensorRT-LLM: `speculative_config=None`. On a lookahead engine a request with (w, n, g) = (1, 1, 0)
also decodes autoregressively.

**Lossless:** it is the reference. Under greedy decoding every speculative mode must reproduce this
output exactly.

**On a 2-core CPU:** a pass of the bundled 135M model takes 20-50 ms, mostly streaming the weights
through the cores for a single position. Adding positions to the same pass costs only a few percent
of that each (where the CPU multiplies bfloat16 natively). That spare capacity is what the other modes spend: guess several tokens, check them all
in one pass.
"""


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    return '<p class="sd-note">Autoregressive: no draft; every target pass gives one token.</p>'

"""Linear layers with their weights packed once for oneDNN, for CPU inference (float32 and bfloat16).

`F.linear` on a CPU re-lays the weight out on every call (oneDNN for bfloat16, MKL's GEMM for a
float32 product of more than one row): for the few rows of a decoding step that costs as much as
the product itself. Packing once at load time (what inductor's freezing is meant to do) makes a
bundled-model pass about 1.3x faster in bfloat16 on a 2-core AVX-512 BF16 machine, with bit-
identical results; in float32 a one-token pass about 1.5x faster and a pass over 2-8 tokens
about 3x, within float32 rounding of F.linear (oneDNN sums in another order than MKL).

On a CPU without native bfloat16 (AVX2, plain AVX-512) a bfloat16 layer keeps a packed float32
copy of its weight for products over 3+ rows: the bfloat16 kernels there cost 3-12x the float32 ones
over 4-64 rows (a verify pass, a prefill). The products are the same ones a bfloat16 GEMM computes
(bfloat16 inputs are exact in float32, the sums are float32), rounded to bfloat16 the same way; only
the order of the sums differs. One- and two-row products stay in bfloat16: they read the weights from
memory once, and half the bytes is what counts. The copy costs twice the layer's bfloat16 memory.

`pack(model)` swaps each plain nn.Linear of a loaded model for a PackedLinear that shares its
weight and bias (tied weights stay tied; code that reads `.weight` sees the same tensor). Under
autograd, or for an input of another dtype, it falls back to F.linear, so a packed model still
trains what reads through it (EAGLE's loss runs the target's LM head on the draft's features).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX-512 BF16 or AMX).

    Without those instructions oneDNN converts to float32 inside its kernels (plain AVX-512) or
    torch falls back to a slower kernel (AVX2): a bfloat16 matrix product over 16+ rows then costs
    2-5x the float32 one, so bfloat16 autocast slows training down, and a many-token verify pass
    costs several one-token passes (speculation earns little in bfloat16 on such a CPU).
    `torch.ops.mkldnn._is_mkldnn_bf16_supported()` is not the test: it is true on any AVX-512 CPU.
    """
    if torch.cuda.is_available():
        return True
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


def upcasts(dtype: torch.dtype) -> bool:
    """Whether wide products of `dtype` weights run in float32 here (bfloat16 without native instructions)."""
    return dtype == torch.bfloat16 and not fast_bf16()


def available(model: nn.Module) -> bool:
    """Packing applies on CPU to a float32 or bfloat16 model."""
    weight = next(model.parameters(), None)
    return weight is not None and _packable(weight)


def _packable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and torch.backends.mkldnn.is_available() and weight.dtype in PACKED_DTYPES


# From this many rows a float32 product of bfloat16 weights beats the bfloat16 one without native
# bfloat16 (30 layers of the bundled model, 2 cores AVX2: 2 rows 29 vs 36 ms, 3 rows 41 vs 39, 16 rows 218 vs 65).
WIDE_ROWS = 3


class PackedLinear(nn.Linear):
    """An nn.Linear (same weight and bias objects) whose forward uses a oneDNN-packed copy of the weight."""

    @classmethod
    def wrap(cls, linear: nn.Linear) -> PackedLinear:
        return cls.of(linear.weight, linear.bias)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
        """A packed linear layer over these (out, in) weights, e.g. rows gathered from an LM head."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.out_features, new.in_features = weight.shape
        new.weight, new.bias = weight, bias
        new._repack()
        return new

    def _repack(self) -> None:
        # A plain attribute, not a buffer: derived, never trained or saved, and an opaque oneDNN
        # tensor that state_dict(), deepcopy and .to() could not handle.
        weight = self.weight.detach()
        # bfloat16 without native instructions: the packed copy is float32, for wide products (module docstring).
        self._upcast = upcasts(weight.dtype)
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.float() if self._upcast else weight, None)
        self._packed_key = self._weight_key()

    def _weight_key(self) -> tuple[int, int]:
        # In-place updates (optimizer steps, load_state_dict) bump the version; .to() and `.data =`
        # swap the storage without bumping it.
        return self.weight._version, self.weight.data_ptr()

    def __getstate__(self):
        # deepcopy / pickle: leave the packed copy behind; the copy packs its own weight when first used.
        return {**self.__dict__, "_packed": None, "_packed_key": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if torch.compiler.is_compiling():  # the packed oneDNN call does not lower in inductor: it packs its own
            wide = getattr(self, "_wide", None)
            # From `_wide_rows` rows: each compiled graph serves a range of widths on one side of it (compiled.py), so
            # the test is static in each graph.
            if wide is not None and x.dtype == w.dtype and x.numel() >= self._wide_rows * self.in_features:
                bias = None if self.bias is None else self.bias.float()
                return F.linear(x.float(), wide, bias).to(w.dtype)
            return F.linear(x, w, self.bias)
        if (x.dtype != w.dtype or w.dtype not in PACKED_DTYPES or w.device.type != "cpu"
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return F.linear(x, w, self.bias)
        if self._weight_key() != self._packed_key:
            self._repack()
        x2 = x.reshape(-1, self.in_features)
        if not self._upcast:
            y = torch.ops.mkldnn._linear_pointwise(x2, self._packed, self.bias, "none", [], "")
        elif x2.shape[0] < WIDE_ROWS:
            return F.linear(x, w, self.bias)
        else:
            bias = None if self.bias is None else self.bias.float()
            y = torch.ops.mkldnn._linear_pointwise(x2.float(), self._packed, bias, "none", [], "").to(w.dtype)
        return y.view(*x.shape[:-1], self.out_features)


def widen(model: nn.Module, rows: int) -> int:
    """Give each upcasting layer a float32 copy of its weight for a compiled graph's products over `rows` rows or more
    (inductor makes it a constant and packs it; the oneDNN-packed copy is opaque to it). Returns how many; costs their
    float32 size."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear) and m._upcast]
    for m in layers:
        m._wide, m._wide_rows = m.weight.detach().float(), rows
    return len(layers)


def rows(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """y = x @ weight.T + bias as a function: packed once where packing applies (a CPU float32 or bfloat16
    weight), else F.linear. For weights gathered per generation (a draft vocabulary's
    rows of an LM head), which `pack` never sees: unpacked, every call re-lays them out (0.34 vs 0.12 ms for
    one row against 8192 rows of 576 in bfloat16 here)."""
    if _packable(weight):
        return PackedLinear.of(weight.detach(), None if bias is None else bias.detach())
    return lambda x: F.linear(x, weight, bias)


def pack(model: nn.Module) -> int:
    """Replace every plain nn.Linear in `model` by a PackedLinear when `available(model)`; returns how many."""
    if not available(model):
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear.wrap(child))
    return len(swaps)

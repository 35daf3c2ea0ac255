"""The mode model, the bottom layer: what each decoding mode is, its settings and how they are checked.

Imported by every layer above (decoding's drafters build from its configs, the runner, training, the service, the
UI) and importing none of them: a registry entry names its drafter and explainer by module path, which the layers
that run or show a mode resolve (docs/architecture.md).
"""

from app.modes.errors import ConfigError
from app.modes.configs import DecodeRequest
from app.modes.registry import MERGED_MODE, MERGED_SUFFIX, Control, Flag, Mode, Modes
from app.modes.shipped import MODES

__all__ = ["ConfigError", "Control", "DecodeRequest", "Flag", "MERGED_MODE", "MERGED_SUFFIX", "MODES", "Mode", "Modes"]

"""The zoo's model names, without importing torch: what a plan's "unknown model" line lists before
anything is built (models/zoo.py builds them)."""

from __future__ import annotations

from models.gpt_config import PRESETS
from models.moe_config import MOE_PRESETS

TOKEN_MLP = "mlp"
ZOO_NAMES: tuple[str, ...] = (*PRESETS, *MOE_PRESETS, TOKEN_MLP)

"""Thin mitmproxy adapters around the sans-IO core: one small addon class per feature."""

from .flowtap import FlowTap
from .tap import Tap

__all__ = ["FlowTap", "Tap"]

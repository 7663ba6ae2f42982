"""Thin mitmproxy adapters around the sans-IO core: one small addon class per feature."""

from .tap import FlowTap, Tap

__all__ = ["FlowTap", "Tap"]

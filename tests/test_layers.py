"""The layer order (DEVELOPERS.md): each package imports only the ones below it.

wire/ (bytes -> frames) -> providers/ (frames -> turn + verdict) -> recording/ -> replay/
-> mitm/ and commands/ (thin adapters). Every import statement of every module counts,
including those inside functions, so a lower layer cannot reach up lazily either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "addon" / "streamtap"
LAYERS = {"wire": 0, "providers": 1, "recording": 2, "replay": 3, "mitm": 4, "commands": 4, "cli": 4}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _own_name(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_packages(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, streamtap package) for every streamtap import in the module (``text``: its source, if not on disk)."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    here = _own_name(path)
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
                names = [".".join(target + ([] if node.module else [alias.name])) for alias in node.names]
            elif node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamtap" and len(parts) > 1 and parts[1] in LAYERS:
                found.add((node.lineno, parts[1]))
    return sorted(found)


def layer_of(path: Path) -> int | None:
    parts = _own_name(path)
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_imports_only_layers_below_it(path):
    mine = layer_of(path)
    if mine is None:  # streamtap/__init__.py: the package itself
        return
    above = [(line, package) for line, package in imported_packages(path) if LAYERS[package] > mine]
    assert not above, f"{path.relative_to(PACKAGE)} (layer {mine}) imports from above it: {above}"


def test_the_walk_sees_every_kind_of_import():
    """The checker itself: absolute, from-, relative and function-level imports are all found."""
    text = (
        "import streamtap.mitm.tap\n"
        "from streamtap.replay import faults\n"
        "from ..commands import verify\n"
        "from .. import cli\n"
        "from . import header\n"
        "def later():\n"
        "    from streamtap.wire import SSEDecoder\n"
    )
    module = PACKAGE / "recording" / "probe.py"
    found = imported_packages(module, text)
    assert found == [(1, "mitm"), (2, "replay"), (3, "commands"), (4, "cli"), (5, "recording"), (7, "wire")]
    assert layer_of(module) == 2
    assert [p for _line, p in found if LAYERS[p] > layer_of(module)] == ["mitm", "replay", "commands", "cli"]

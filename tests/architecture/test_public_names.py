"""Packages talk through public names: no module imports another package's `_private` name (the
native modules, imported only by their wrappers, are checked by import-linter)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"rhymerl": ROOT / "rhymerl", "rhymerl.operator": ROOT / "operator", "rhymerl.workers": ROOT / "workers"}
WRAPPERS = {("rhymerl.algorithms.drafting.index", "_suffix_index"),
            ("rhymerl.workers.model.cached_attention", "_cached_attention")}


def modules() -> list[tuple[str, ast.Module]]:
    found = []
    for name, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            dotted = ".".join([name, *rel.parts]).removesuffix(".__init__")
            found.append((dotted, ast.parse(path.read_text(encoding="utf-8"))))
    return found


def private_imports(module: str, tree: ast.Module) -> list[str]:
    bad = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if alias.name.startswith("_") and (module, alias.name) not in WRAPPERS and node.module != package:
                    bad.append(f"{module}: from {node.module} import {alias.name}")
    return bad


def test_no_module_imports_a_private_name_of_another_package() -> None:
    found = modules()
    assert len(found) > 100  # the walk saw the whole package
    assert [line for module, tree in found for line in private_imports(module, tree)] == []


def test_the_check_catches_a_private_import() -> None:
    tree = ast.parse("from rhymerl.workers.controller.loop import _steps\n")
    assert private_imports("rhymerl.tools.bench.rollout", tree) == [
        "rhymerl.tools.bench.rollout: from rhymerl.workers.controller.loop import _steps"]

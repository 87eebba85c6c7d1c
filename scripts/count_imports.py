#!/usr/bin/env python3
"""Count how the package's modules import each other, against the layers of its import contract.

Two numbers say how far the code is from its layering (docs/explanation/architecture.md):

* in-function imports: ``import``/``from`` statements inside a function (or method) that name a
  ``django_jobs`` module, per module. Each one is either a dodge around an import cycle (to be
  fixed by moving code down a layer) or a deliberate deferral, such as the backend's, which
  Django imports before it knows whether the app is installed;
* upward imports: any import (module level or not) from a module to a module of a higher layer,
  and imports between siblings declared independent (``a | b``), against the ``layers`` contract
  of ``[tool.importlinter]`` in pyproject.toml.

Only the standard library: ``python scripts/count_imports.py [--package DIR] [--config FILE] [-v]``.
``--package`` may point at another checkout's ``django_jobs`` (to measure a tree from before a
change against today's contract). Exit status 0 whatever the counts: this measures, lint-imports
enforces.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_jobs"


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int
    in_function: bool


def module_name(path: Path, package_dir: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str, package_dir: Path) -> bool:
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    base = package_dir / rel
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def resolve(source: str, is_package: bool, node: ast.ImportFrom, package_dir: Path) -> list[str]:
    """The ``django_jobs`` modules a ``from ... import ...`` statement loads."""
    if node.level:
        base = source.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    if prefix != PACKAGE and not prefix.startswith(PACKAGE + "."):
        return []
    targets = []
    for alias in node.names:
        candidate = f"{prefix}.{alias.name}"
        targets.append(candidate if alias.name != "*" and is_module(candidate, package_dir) else prefix)
    return targets


class Collector(ast.NodeVisitor):
    def __init__(self, source: str, is_package: bool, package_dir: Path):
        self.source, self.is_package, self.package_dir = source, is_package, package_dir
        self.depth = 0
        self.edges: list[Edge] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self.edges.append(Edge(self.source, alias.name, node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for target in dict.fromkeys(resolve(self.source, self.is_package, node, self.package_dir)):
            self.edges.append(Edge(self.source, target, node.lineno, self.depth > 0))


def collect(package_dir: Path) -> list[Edge]:
    edges: list[Edge] = []
    for path in sorted(package_dir.rglob("*.py")):
        source = module_name(path, package_dir)
        collector = Collector(source, path.name == "__init__.py", package_dir)
        collector.visit(ast.parse(path.read_text(), str(path)))
        edges.extend(e for e in collector.edges if e.target != e.source)
    return edges


def read_layers(config: Path) -> tuple[list[list[str]], list[bool]]:
    """The layers contract of ``config``, top first: the module tails of each layer and whether
    they are independent of each other."""
    data = tomllib.loads(config.read_text())
    contracts = data.get("tool", {}).get("importlinter", {}).get("contracts", [])
    for contract in contracts:
        if contract.get("type") == "layers" and contract.get("containers") == [PACKAGE]:
            layers, independent = [], []
            for raw in contract["layers"]:
                sep = ":" if ":" in raw else "|"
                layers.append([part.strip() for part in raw.split(sep)])
                independent.append(sep == "|")
            return layers, independent
    sys.exit(f"{config}: no layers contract with containers = [{PACKAGE!r}] under [tool.importlinter].")


def layer_of(module: str, layers: list[list[str]]) -> tuple[int, str] | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself (its lazy __init__) belongs to no layer
    for index, members in enumerate(layers):
        if parts[1] in members:
            return index, parts[1]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=ROOT / PACKAGE, help="the django_jobs directory to read")
    parser.add_argument("--config", type=Path, default=ROOT / "pyproject.toml", help="holds the layers contract")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every import counted")
    opts = parser.parse_args()
    package_dir = opts.package.resolve()
    edges = collect(package_dir)
    layers, independent = read_layers(opts.config)

    # One count per statement: ``from . import engine, retention`` in a function is one.
    deferred = [e for e in edges if e.in_function]
    statements = {(e.source, e.line) for e in deferred}
    per_module = Counter(source for source, _ in statements)
    print(f"in-function import statements naming {PACKAGE} modules: {len(statements)} in {len(per_module)} modules")
    for module, n in sorted(per_module.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:4}  {module}")
        if opts.verbose:
            for e in deferred:
                if e.source == module:
                    print(f"          line {e.line}: {e.target}")

    upward, siblings, unplaced = [], [], set()
    for e in edges:
        src, dst = layer_of(e.source, layers), layer_of(e.target, layers)
        for module, found in ((e.source, src), (e.target, dst)):
            if found is None and module != PACKAGE:
                unplaced.add(module.split(".")[1])
        if src is None or dst is None:
            continue
        if dst[0] < src[0]:
            upward.append(e)
        elif dst[0] == src[0] and dst[1] != src[1] and independent[src[0]]:
            siblings.append(e)
    print(f"upward imports (against the layers contract in {opts.config.name}): {len(upward)}")
    for e in upward:
        where = "in a function" if e.in_function else "module level"
        print(f"        {e.source} -> {e.target} (line {e.line}, {where})")
    print(f"imports between independent siblings: {len(siblings)}")
    for e in siblings:
        print(f"        {e.source} -> {e.target} (line {e.line})")
    if unplaced:
        print(f"modules in no layer: {', '.join(sorted(unplaced))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

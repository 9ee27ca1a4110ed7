"""Count the package's units (root modules and folders) and the longest chain of imports between them.

    uv run python benchmarks/import_layers.py .                       # this checkout
    git archive aeef57a hvp_lightning | tar x -C /tmp/old && uv run python benchmarks/import_layers.py /tmp/old

Every ``from ... import`` under ``hvp_lightning/`` counts, function-level ones included.
"""

import ast
import functools
import sys
from pathlib import Path

root = Path(sys.argv[1]).resolve()
pkg = root / "hvp_lightning"


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                parts = path.relative_to(root).with_suffix("").parts[:-1]
                mod = ".".join([*parts[: len(parts) - node.level + 1], *([mod] if mod else [])])
            if mod == "hvp_lightning":
                out |= {f"{mod}.{a.name}" for a in node.names}
            elif mod.startswith("hvp_lightning."):
                out.add(mod)
    return out


def unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2:
        return "__init__"
    return parts[1] + "/" if (pkg / parts[1]).is_dir() else parts[1]


graph: dict[str, set[str]] = {}
for p in pkg.rglob("*.py"):
    here = unit(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"))
    graph.setdefault(here, set()).update(u for u in map(unit, imports(p)) if u != here)


@functools.cache
def chain(u: str) -> int:
    return 1 + max((chain(v) for v in graph.get(u, ())), default=0)


print(f"{len(graph)} units; longest import chain: {max(map(chain, graph))} units")

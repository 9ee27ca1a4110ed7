"""The installable library: public API, the example of the mixin on a user's own module,
console commands and configs shipped in the wheel, no import cycle, no private imports."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import hvp_lightning
from hvp_lightning.selection import pair_index

REPO = Path(__file__).resolve().parents[1]


def test_public_api_names_resolve_and_import_is_light() -> None:
    for name in hvp_lightning.__all__:
        assert getattr(hvp_lightning, name) is not None, name
    assert hvp_lightning.__version__.count(".") == 2
    # `import hvp_lightning` alone must not pull in torch (console start-up, light tools).
    out = subprocess.run(
        [sys.executable, "-c", "import sys, hvp_lightning; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def _example():
    spec = importlib.util.spec_from_file_location("custom_method", REPO / "examples" / "custom_method.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_mixin_selects_the_hardest_pair_and_trains() -> None:
    ex = _example()
    model = ex.main(max_steps=2)
    table, choice = model.last_selection["table"], model.last_selection["choice"]
    assert table.shape[1] == 6 and torch.equal(choice, table.argmax(1))  # N=4: C(4,2) pairs, hardest each
    # The table is the hook's per-sample loss of each pair, recomputed here by brute force.
    batch = next(iter(ex.random_views()))
    with torch.no_grad():
        z = [model.encoder(v) for v in batch["views"]]
        brute = torch.stack([ex.pair_loss(z[k], z[l]) for k, l in pair_index(4).tolist()], 1)
        assert torch.allclose(model.candidate_scores(batch), brute)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # resolve relative imports against the file's package
                pkg = path.relative_to(REPO).with_suffix("").parts[:-1]
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join([*base, mod] if mod else base)
            out.append((mod, [a.name for a in node.names]))
    return out


def test_no_private_names_imported_across_modules() -> None:
    bad = [
        f"{p.relative_to(REPO)}: {mod}.{name}"
        for p in (REPO / "hvp_lightning").rglob("*.py")
        for mod, names in _imports(p)
        if mod.startswith("hvp_lightning")
        for name in names
        if name.startswith("_") and name != "__version__"
    ]
    assert bad == []


def test_no_import_cycle_between_package_modules() -> None:
    """Module-level imports only (function-level ones hide cycles, so they count too)."""
    graph: dict[str, set[str]] = {}
    for p in (REPO / "hvp_lightning").rglob("*.py"):
        name = ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = {mod for mod, _ in _imports(p) if mod.startswith("hvp_lightning") and mod != name}
    # package __init__s that only re-export are not edges of a cycle through their children
    graph["hvp_lightning"] = set()

    def visit(node: str, stack: list[str], done: set[str]) -> None:
        if node in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(node) :], node]))
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*stack, node], done)
        done.add(node)

    done: set[str] = set()
    for node in sorted(graph):
        visit(node, [], done)


@pytest.mark.slow
def test_wheel_ships_configs_and_console_commands(tmp_path: Path) -> None:
    """`uv build` a wheel, install it into a fresh environment and train from another folder."""
    uv = subprocess.run(["uv", "--version"], capture_output=True)
    if uv.returncode != 0:
        pytest.skip("needs uv")
    subprocess.run(["uv", "build", "--wheel", "-o", str(tmp_path / "dist"), str(REPO)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "hvp_lightning/conf/config.yaml" in names and any(n.endswith("entry_points.txt") for n in names)
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "-q", "-p", str(py), str(wheel)], check=True)
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            str(venv / "bin" / "hvp-train"),
            "logger=csv",
            "trainer.max_epochs=1",
            "data.train_size=64",
            "data.test_size=32",
            "method.batch_size=32",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "k-NN top-1" in out.stdout and (run_dir / "summary.json").is_file()


def test_run_totals_survive_a_checkpoint_of_any_mixin_host() -> None:
    """The mixin owns HVP's run totals, checkpoint state included: a user's own module (the
    example, not an SSLMethod) resumes with the totals it saved, so its summary stays whole."""
    ex = _example()
    model = ex.main(max_steps=2)
    assert model.hvp_totals is not None and int(model.hvp_totals[2]) == 16  # 2 steps x 8 images
    ckpt: dict = {}
    model.on_save_checkpoint(ckpt)
    restored = ex.CosineSSL(model.hvp)
    restored.on_load_checkpoint(ckpt)
    assert torch.equal(restored.hvp_totals, model.hvp_totals.cpu())


def test_design_module_map_names_files_that_exist() -> None:
    """docs/DESIGN.md section 9 says where each concern lives: every package path it names must
    exist, so the map cannot go stale silently."""
    import re

    design = (REPO / "docs" / "DESIGN.md").read_text().split("## 9.")[1]
    modules = "\n".join(row.rsplit("|", 2)[1] for row in design.splitlines() if row.startswith("| "))
    named = set()
    for cell in re.findall(r"`([a-z_/{},.]+(?:\.py|/))`", modules):
        head, _, rest = cell.partition("{")
        if rest:  # `evaluation/{run,probe}.py`: one path per name
            names, _, tail = rest.partition("}")
            named |= {f"{head}{n}{tail}" for n in names.split(",")}
        else:
            named.add(cell)
    assert len(named) > 30
    missing = sorted(p for p in named if not (REPO / "hvp_lightning" / p).exists())
    assert missing == []


def test_every_public_name_documents_its_arguments_and_result() -> None:
    # The rule for the public API (issue 27): a docstring on every exported function and class,
    # with "Args:" and "Returns:" for functions that take parameters, "Args:" for classes --
    # checked over the public listing, so a newly exported name must follow it too.
    missing = []
    for name in hvp_lightning.__all__:
        obj = getattr(hvp_lightning, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue  # __version__, METHODS: data, not API with a signature
        doc = inspect.getdoc(obj) or ""
        if not doc:
            missing.append(f"{name}: no docstring")
            continue
        if inspect.isclass(obj):
            needed = ["Args:"]
        else:
            needed = ["Args:", "Returns:"] if inspect.signature(obj).parameters else []
        missing += [f"{name}: no {section!r} section" for section in needed if section not in doc]
    assert not missing, missing

"""The installable library: public API, the example of the mixin on a user's own module,
console commands and configs shipped in the wheel, no import cycle, no private imports."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
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
    assert "hvp_lightning/CITATION.cff" in names  # the model card of hvp-export quotes it
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


def _design_block(name: str) -> list[str]:
    """The lines of docs/DESIGN.md between ``<!-- NAME: read by tests/test_package.py -->`` and ``<!-- /NAME -->``."""
    design = (REPO / "docs" / "DESIGN.md").read_text()
    return design.split(f"<!-- {name}: read by tests/test_package.py -->")[1].split(f"<!-- /{name} -->")[0].split("\n")


def _units(text: str) -> list[str]:
    """The units named in ``text``: root modules (```config```) and folders (```run/```)."""
    return re.findall(r"`([a-z_]+/?)`", text)


def _layers() -> dict[str, int]:
    """docs/DESIGN.md section 9's layer list: ``{unit: layer}``, a unit being a root module
    (``config``) or a folder (``run/``)."""
    layers = {}
    for line in filter(None, _design_block("layers")):
        number, _, rest = line.partition(". ")
        for unit in _units(rest.split(" -- ")[0]):
            layers[unit] = int(number)
    return layers


def _allowed_imports() -> dict[str, set[str]]:
    """docs/DESIGN.md section 9's self-contained units: ``{unit: units it may import}``."""
    allowed = {}
    for line in filter(None, _design_block("imports only")):
        unit, _, rest = line.removeprefix("- ").partition(" imports only ")
        allowed[_units(unit)[0]] = set(_units(rest))
    return allowed


def _unit(module: str) -> str:
    """``hvp_lightning.run.records`` -> ``run/``; ``hvp_lightning.config`` -> ``config``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1] + "/" if (REPO / "hvp_lightning" / parts[1]).is_dir() else parts[1]


def test_every_import_points_down_the_design_layers() -> None:
    """Folders by concern, one way: a module imports from its own folder or a lower layer of
    DESIGN.md's list, never from above or beside it (function-level imports too), and every
    module and folder of the package is on the list."""
    layers = _layers()
    assert len(set(layers.values())) >= 8 and "run/" in layers and "training/" in layers
    units = {_unit(".".join(p.relative_to(REPO).with_suffix("").parts)) for p in (REPO / "hvp_lightning").glob("*")}
    units -= {"__pycache__", "conf"}
    assert units - layers.keys() == set(), "on no layer of docs/DESIGN.md section 9"
    assert layers.keys() - units == set(), "listed in docs/DESIGN.md section 9 but not in the package"
    upward = []
    for p in (REPO / "hvp_lightning").rglob("*.py"):
        name = ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        here = _unit(name) if name != "hvp_lightning" else "__init__"
        for mod, names in _imports(p):
            if not mod.startswith("hvp_lightning"):
                continue
            targets = [f"{mod}.{n}" for n in names] if mod == "hvp_lightning" else [mod]
            for target in targets:
                there = _unit(target)
                if there != here and layers[there] >= layers[here]:
                    upward.append(
                        f"{p.relative_to(REPO)} ({here}, layer {layers[here]}) imports {target} (layer {layers[there]})"
                    )
    assert upward == []


def test_the_mixin_imports_only_losses_nn_and_the_allowed_names() -> None:
    """A user's own LightningModule with its own loader is a complete host of ``HardViewMixin``
    (docs/methods.md): ``selection/`` imports only the units docs/DESIGN.md section 9 lets it
    (``losses/``, ``nn/``, the leaf of allowed names) and libraries -- no loader, cluster, run,
    training or config code, although they sit below it in the layers (function-level imports
    count)."""
    layers, allowed = _layers(), _allowed_imports()
    assert "selection/" in allowed and "losses/" in allowed["selection/"]
    assert not allowed["selection/"] & {"data/", "cluster/", "run/", "training/", "config", "config_rules"}
    assert all(set(units) <= layers.keys() for units in allowed.values()), "allowed units not on the layer list"
    seen, outside = set(), []
    for p in (REPO / "hvp_lightning").rglob("*.py"):
        here = _unit(".".join(p.relative_to(REPO).with_suffix("").parts))
        if here not in allowed:
            continue
        for mod, names in _imports(p):
            if not mod.startswith("hvp_lightning"):
                continue
            for target in [f"{mod}.{n}" for n in names] if mod == "hvp_lightning" else [mod]:
                there = _unit(target)
                seen.add(there)
                if there != here and there not in allowed[here]:
                    outside.append(f"{p.relative_to(REPO)} ({here}) imports {target}")
    assert outside == []
    assert {"losses/", "nn/"} <= seen  # the check saw the imports it rules on


def test_every_folder_says_what_it_owns_and_what_it_may_import() -> None:
    import ast

    for init in sorted((REPO / "hvp_lightning").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80 and "import" in doc.lower(), (
            f"{init.relative_to(REPO)}: its docstring must say what it owns and may import"
        )


def test_every_public_name_documents_its_arguments_and_result() -> None:
    # The rule for the public API: a docstring on every exported function and class,
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

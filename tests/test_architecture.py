"""The shape of the tree: no module imports another module's private (underscore) names, and
the imports between tlx's modules (at module level or inside functions) form no circle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tlx"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["tlx", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str, modules: dict) -> list[tuple[str, str]]:
    """(imported tlx module, imported name or "") for every import statement of the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("tlx")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("tlx"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, "") if sub in modules else (base, a.name))
    return found


def test_no_module_imports_a_private_name():
    modules = _modules()
    private = []
    for module, path in modules.items():
        for target, name in _imports(path, module, modules):
            if name.startswith("_") or any(part.startswith("_") for part in target.split(".")):
                private.append(f"{module} imports {target}{'.' + name if name else ''}")
    assert private == []


def test_no_import_circle():
    """Importing ``tlx.a.b`` runs ``tlx/a/__init__.py`` too, so that counts as an edge, except from
    a module inside ``tlx.a`` (its packages are already being imported when it runs) and to the
    root package ``tlx``. Naming ``tlx.a`` explicitly always counts."""
    modules = _modules()
    edges: dict[str, set] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, _ in _imports(path, module, modules):
            edges[module].add(target)
            parts = target.split(".")
            for n in range(2, len(parts)):
                parent = ".".join(parts[:n])
                if not module.startswith(parent + "."):  # a module's own packages are initialising already
                    edges[module].add(parent)
        edges[module].discard(module)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m)

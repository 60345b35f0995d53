"""The package's layout, read from the source (`ast`; nothing is imported): no import circle between
gpseq's modules, every import along the layer order of docs/architecture.md (a module imports its
own layer and the layers below it), at most MAX_ROOT_MODULES modules at the package root, none of
gpseq's modules longer than MAX_MODULE_LINES lines, and the training apart from the Tagger: nothing
of gpseq/training/ imports gpseq/tagger.py.

Every `import` / `from … import` of a gpseq module counts, at the top of a module or inside a
function (a lazy import is still a dependency), except under `if TYPE_CHECKING:` (annotations only)
and `from gpseq import __version__` (the version string; the rest of gpseq/__init__.py is the lazy
front door `gpseq.Tagger`, `gpseq.ModelChain`). A known exception is one entry of ALLOWED, with its
reason: a new upward import or circle fails, and so does an entry once its import is gone.

And one NumPy linear chain: the functions whose names say they are a chain algorithm are defined in
structured/numpy_chain.py only (besides the TensorFlow chain of SVI), and training, prediction and
the span probabilities import it.

And the tests' own layout: tests/ mirrors gpseq/ (every folder under tests/ but helpers/ is a
package of gpseq), no file under tests/ is over 600 lines, and none is named after an issue or a
review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpseq"
MAX_ROOT_MODULES = 10
MAX_MODULE_LINES = 400

# docs/architecture.md's layer table, lowest first: (layer, the modules and packages in it). A
# module belongs to the longest name here that is it or a package above it (`gpseq` itself: only
# gpseq/__init__.py).
LAYERS = [
    ("base", ["gpseq.errors", "gpseq.cancellation", "gpseq._tensorflow", "gpseq._tfp"]),
    ("corpora", ["gpseq.corpora"]),
    ("saved", ["gpseq.saved"]),
    ("features", ["gpseq.features"]),
    ("gp", ["gpseq.gp"]),
    ("structured", ["gpseq.structured"]),
    ("training", ["gpseq.training"]),
    ("config", ["gpseq.config"]),
    ("evaluation", ["gpseq.evaluation"]),
    ("predict", ["gpseq.predict"]),
    ("active", ["gpseq.active"]),
    ("tagger", ["gpseq.tagger", "gpseq.saved.tagger", "gpseq.training.train", "gpseq.chain_models"]),
    ("front ends", ["gpseq.cli", "gpseq.spacy", "gpseq.serve", "gpseq.__main__", "gpseq"]),
]

# Known imports against the layer order or around a circle: (importer, imported) -> why it stays.
ALLOWED = {
    ("gpseq.serve.process", "gpseq.serve.app"):
        "the server process builds the app it runs; app.py reads process.rss_mib back (one package)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _owner(name: str) -> str | None:
    """The gpseq module that `import name` runs last: `name` or the nearest package above it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, tree: ast.Module) -> set[str]:
    """The gpseq modules `module` imports anywhere in `tree`, but under `if TYPE_CHECKING:`."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: gpseq uses none, but read them right
                above = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(above + ([base] if base else []))
            for alias in node.names:
                if base == "gpseq" and alias.name == "__version__":
                    continue
                names.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]
        for name in names:
            owner = _owner(name) if name.split(".")[0] == "gpseq" else None
            if owner is not None and owner != module:
                found.add(owner)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


GRAPH = {module: _imported(module, ast.parse(path.read_text(encoding="utf-8"), str(path)))
         for module, path in MODULES.items()}


def _layer(module: str) -> int:
    """The index in LAYERS of the layer `module` belongs to."""
    best, layer = "", None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            inside = module == name or (name != "gpseq" and module.startswith(name + "."))
            if inside and len(name) > len(best):
                best, layer = name, index
    if layer is None:
        raise LookupError(f"{module} is in no layer: add it (or its package) to LAYERS and docs/architecture.md")
    return layer


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as [a, b, …, a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def _without_allowed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {module: {target for target in targets if (module, target) not in ALLOWED}
            for module, targets in graph.items()}


def test_the_graph_is_read():
    """The reader sees lazy imports, `from package import module` and `import_module` (guards the
    other tests against passing on an empty graph)."""
    assert "gpseq.saved.tagger" in GRAPH["gpseq.tagger"]  # top of the module
    assert "gpseq.active.selection" in GRAPH["gpseq.tagger"]  # inside Tagger.select
    assert "gpseq._tensorflow" in GRAPH["gpseq.saved.tagger"]  # `from gpseq import _tensorflow`
    assert "gpseq._tensorflow" in GRAPH["gpseq"]  # importlib.import_module("gpseq._tensorflow")
    assert "gpseq.features.featurizer" not in GRAPH["gpseq.features.vocabulary"]  # under TYPE_CHECKING
    assert "gpseq" not in GRAPH["gpseq.saved.format"]  # `from gpseq import __version__`


def test_at_most_ten_modules_at_the_package_root():
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, (
        f"{len(root)} modules at gpseq/'s root (at most {MAX_ROOT_MODULES}): {', '.join(root)}; put the new one "
        "in the package of its layer (docs/architecture.md)")


def test_no_module_over_the_line_limit():
    long = sorted(f"{path.relative_to(ROOT)}: {lines} lines" for path in MODULES.values()
                  if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES)
    assert not long, (f"modules over {MAX_MODULE_LINES} lines (split them by responsibility, each part a module "
                      "whose docstring says what it owns):\n" + "\n".join(long))


def test_the_training_imports_nothing_of_the_tagger():
    """The training (gpseq/training/, its entry point `training/train.py` of the tagger layer included)
    returns the parts a Tagger is built from and is given a previous model as its parts: it never
    imports gpseq/tagger.py (the layer order alone would allow `training/train.py` to)."""
    training = [module for module in MODULES if module.startswith("gpseq.training.")]
    assert "gpseq.training.train" in training
    assert "gpseq.training.train" in GRAPH["gpseq.tagger"]  # Tagger.train delegates to it
    importers = sorted(module for module in training if "gpseq.tagger" in GRAPH[module])
    assert not importers, f"gpseq/training/ modules importing gpseq.tagger: {importers}"


def test_no_import_circle():
    cycle = _find_cycle(_without_allowed(GRAPH))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_go_down_the_layer_order():
    upward = sorted(f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
                    for module, targets in _without_allowed(GRAPH).items() for target in targets
                    if _layer(target) > _layer(module))
    assert not upward, "imports against the layer order of docs/architecture.md:\n" + "\n".join(upward)


@pytest.mark.parametrize("importer, imported", sorted(ALLOWED))
def test_each_allowed_exception_is_still_there(importer, imported):
    """An exception whose import is gone comes off ALLOWED, so that it cannot come back unnoticed."""
    assert imported in GRAPH.get(importer, ()), f"{importer} no longer imports {imported}: remove it from ALLOWED"


def test_the_layer_table_of_docs_architecture_is_this_order():
    """docs/architecture.md's table names the same layers in the same order (its first column)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([^|]+?) \| `gpseq", text, flags=re.MULTILINE)
    assert rows == [name for name, _ in LAYERS]


# The NumPy linear chain: one forward–backward and one (k-best) Viterbi, in one module; the
# TensorFlow chain of SVI (chain.py over log_semiring.py) is the other implementation kept.
NUMPY_CHAIN = "gpseq.structured.numpy_chain"
TENSORFLOW_CHAIN = {"gpseq.structured.chain", "gpseq.structured.log_semiring"}
# what a chain algorithm's name says: a Viterbi, a forward–backward, the messages, the log-partition
CHAIN_ALGORITHM = re.compile(r"viterbi|forward_backward|(^|_)messages$|log_partition")
# the modules that run the NumPy chain: the default training, calibration, prediction, spans
CHAIN_USERS = ["gpseq.training.chain_objective", "gpseq.training.calibration", "gpseq.predict.linear",
               "gpseq.structured.spans"]


def _function_names(tree: ast.Module) -> list[str]:
    """Every function and method defined in `tree`, as `name` or `Class.name` (nested ones too)."""
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(prefix + child.name)
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _chain_algorithms(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), str(MODULES[module]))
    return [name for name in _function_names(tree) if CHAIN_ALGORITHM.search(name.rpartition(".")[2])]


def test_the_numpy_chain_is_one_module():
    """No module but numpy_chain.py (and the TensorFlow chain) defines a forward–backward, a
    Viterbi, chain messages or a log-partition, by name; numpy_chain.py defines them all (the scan
    finds them there, so a renaming cannot make it pass by finding nothing)."""
    assert {"TimeMajor.forward_backward", "TimeMajor.scaled_messages", "TimeMajor.viterbi", "nbest_viterbi",
            "viterbi"} <= set(_chain_algorithms(NUMPY_CHAIN))
    elsewhere = [f"{module}: {name}" for module in MODULES if module not in TENSORFLOW_CHAIN | {NUMPY_CHAIN}
                 for name in _chain_algorithms(module)]
    assert not elsewhere, ("a chain algorithm outside structured/numpy_chain.py (build it on TimeMajor there):\n"
                           + "\n".join(elsewhere))


@pytest.mark.parametrize("module", CHAIN_USERS)
def test_training_prediction_and_spans_run_the_one_numpy_chain(module):
    assert NUMPY_CHAIN in GRAPH[module], f"{module} no longer runs {NUMPY_CHAIN}"


# ---- the tests' own layout: tests/ mirrors gpseq/ -------------------------------------------------
TESTS = ROOT / "tests"
MAX_TEST_FILE_LINES = 600
# folders under tests/ that are no package of gpseq: what several test modules import, test data
NOT_MIRRORED = {"helpers", "fixtures", "__pycache__"}
# a test file is named for its subject, never for where its tests came from
ORIGIN_WORDS = ("review", "issue", "robustness")


def _under_tests(pattern: str) -> list[Path]:
    """The paths under tests/ matching `pattern`, but those in NOT_MIRRORED folders or hidden ones."""
    return sorted(path for path in TESTS.rglob(pattern)
                  if not any(part in NOT_MIRRORED or part.startswith(".") for part in path.relative_to(TESTS).parts))


def test_the_test_files_are_found():
    """Guards the tests below against passing on an empty tree."""
    files = _under_tests("test_*.py")
    assert len(files) > 50 and TESTS / "test_layout.py" in files and TESTS / "cli" / "test_tag.py" in files


def test_every_folder_of_tests_is_a_package_of_gpseq():
    """tests/X/ holds the tests of gpseq/X/ (those of a module at gpseq/'s root stay in tests/)."""
    stray = [str(path.relative_to(TESTS)) for path in _under_tests("*")
             if path.is_dir() and not (PACKAGE / path.relative_to(TESTS) / "__init__.py").is_file()]
    assert not stray, (f"folders under tests/ that are no package of gpseq/: {', '.join(stray)}; put their "
                       f"tests in the folder of their subject (or shared code in tests/helpers/)")


def test_no_file_of_tests_is_over_600_lines():
    long = [f"{path.relative_to(TESTS)}: {n:,} lines" for path in sorted(TESTS.rglob("*.py"))
            if "__pycache__" not in path.parts
            and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_TEST_FILE_LINES]
    assert not long, (f"files under tests/ over {MAX_TEST_FILE_LINES} lines (split them by subject):\n"
                      + "\n".join(long))


def test_no_file_of_tests_is_named_after_an_issue_or_a_review():
    named = [str(path.relative_to(TESTS)) for path in sorted(TESTS.rglob("*"))
             if "__pycache__" not in path.parts and any(word in path.name.lower() for word in ORIGIN_WORDS)]
    assert not named, f"name them for their subject, not for where they came from: {', '.join(named)}"

"""What several test modules share (pyproject.toml puts tests/ on sys.path: `import helpers`).

Paths of the checkout here; the rest in the modules beside this one, each named for what it holds:
`cli` (the in-process command line and one tiny model of it), `files` (sha256 snapshots of
folders), `tiny_model` (the tiny corpus and models the fault and limit tests start from),
`peak_rss` (a command's peak memory), `serve`, `laplace`, `tiny_design`, `gp`, `active`,
`sample_models`."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: gpseq/, cli.py, corpora/, tests/
SAMPLE = ROOT / "corpora" / "sample"  # the bundled sample corpus
TESTS = ROOT / "tests"

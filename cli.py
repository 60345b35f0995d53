"""The `gpseq` command from a checkout: `python cli.py --help` (the same app as `python -m gpseq`
and, installed, the `gpseq` console script). The commands live in `gpseq/cli/`, one module each."""

from gpseq.cli import app, main

# Names tests/test_robustness.py reaches through this module; to go once its imports name
# gpseq.cli.* and gpseq.corpora.text directly (that file was being edited elsewhere at the move).
from gpseq.cli.outputs import train_lock as _train_lock  # noqa: E402,F401
from gpseq.cli.train import TrainProgress as _TrainProgress  # noqa: E402,F401
from gpseq.corpora.text import TEXT_MAX_CHARS, TEXT_MAX_TOKENS, iter_text  # noqa: E402,F401
from gpseq.writers import ConllWriter as _ConllWriter  # noqa: E402,F401


def _iter_text(source, name, encoding, nlp, **limits):
    """The raw-text reader as the tests see it: items with `.sentence` and `.spaces`."""
    from types import SimpleNamespace

    for sentence in iter_text(source, nlp, encoding=encoding, name=name, **limits):
        yield SimpleNamespace(sentence=sentence, spaces=sentence.spaces)


__all__ = ["app", "main"]

if __name__ == "__main__":
    main()

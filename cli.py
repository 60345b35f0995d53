"""The `gpseq` command from a checkout: `python cli.py --help` (the same app as `python -m gpseq`
and, installed, the `gpseq` console script). The commands live in `gpseq/cli/`, one module each."""

from gpseq.cli import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()

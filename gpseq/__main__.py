"""`python -m gpseq`: the `gpseq` command."""

from gpseq.cli import main

main()

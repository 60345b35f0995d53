"""`python -m gpseq`: the `gpseq` command.

`python -m` puts the working directory first on `sys.path`; it is taken off, as the installed
`gpseq` command has it, so a module lying beside the files being tagged (e.g. in a model directory's
parent) is never imported in place of an installed one or as a plug-in.
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from gpseq.cli import main  # noqa: E402

main()

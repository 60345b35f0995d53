"""gpseq in spaCy: the factory `gpseq` (`component.py`), the `Token._` / `Span._` extensions and their
per-Doc store (`extensions.py`), the token annotations a model reads (`attributes.py`), the
component's scores (`scoring.py`).

Named `gpseq.spacy`; every module here imports spaCy itself by its absolute name (`import spacy`,
`from spacy.tokens import Doc`), which Python 3 never resolves to this package."""

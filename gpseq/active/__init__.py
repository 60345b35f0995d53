"""Active learning: the chains drawn from the model and the batch picked (`selection.py`:
`Tagger.select`), the acquisition functions that score them (`acquisition.py`), the picked sentences
written for annotation tools (`annotation.py`)."""

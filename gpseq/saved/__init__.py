"""What gpseq writes to disk and reads back: the one check of a saved JSON file's header
(`format.py`), a model's files read within bounds (`files.py`), tagger.json (`meta.py`), the model
directory: manifest, replacement, swap, arrays (`directory.py`), and a tagger's parts written to and
read from it (`tagger.py`). All but `tagger.py` know nothing of models, features or TensorFlow: the
featurizer's files and the training checkpoints use them too."""

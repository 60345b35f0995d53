"""From a trained model to tagged output: batched, windowed prediction (`predictor.py`), the default
model's deterministic predictive in NumPy (`linear.py`), a predicted batch decoded into
`TaggedSentence`s (`decode.py`), and those written as CoNLL, JSONL or spaCy Docs (`writers.py`)."""

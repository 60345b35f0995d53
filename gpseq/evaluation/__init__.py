"""How good and how calibrated a tagger is: the evaluation report (`evaluate.py`) over the metric
functions (`metrics.py`), selective prediction and abstention (`trust.py`), reliability diagrams
(`reliability.py`)."""

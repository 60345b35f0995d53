"""`Tagger.tag(should_stop=...)` (gpseq/cancellation.py): a prediction told to stop raises
`Cancelled` at its next check, with no long stretch of work between two checks; one never told
returns exactly what it returns without a `should_stop`.

One tiny model (the default training on the bundled sample, its deterministic predictive in
NumPy); a long sentence (windows, one chain over the whole sentence, k-best Viterbi, span-F1
decoding) and short ones (one batch)."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np
import pytest

from gpseq.cancellation import CHECK_STEPS, Cancelled, check_cancelled, stopping_when

SAMPLE = Path(__file__).resolve().parents[1] / "corpora" / "sample"
WORDS = "The committee approved the new budget on Tuesday , and it will fund three small projects".split()
LONG = (WORDS * 400)[:5_000]  # 5 windows of the default 1,000 tokens
SHORT = [WORDS[:n] for n in (3, 7, 15)]


@pytest.fixture(scope="module")
def tagger():
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.config import TrainingConfig

    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus is absent")
    config = TaggerConfig(features=get_preset("ner"), training=TrainingConfig(max_steps=30, dev_fraction=0.0, seed=1))
    return Tagger.train(read_conll(SAMPLE / "train.conll"), config)


class Asked:
    """A `should_stop` that says yes from its `stop_at`-th call on (never when None), and records
    when each call came."""

    def __init__(self, stop_at: int | None = None):
        self.stop_at, self.times = stop_at, []

    def __call__(self) -> bool:
        self.times.append(time.perf_counter())
        return self.stop_at is not None and len(self.times) >= self.stop_at


def same(a, b) -> None:
    assert (a.labels, a.sequence_log_prob, a.spans, a.nbest) == (b.labels, b.sequence_log_prob, b.spans, b.nbest)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)


@pytest.mark.parametrize("options", [{"nbest": 20}, {"decode": "span-f1"}])
def test_a_never_stopped_prediction_returns_what_it_returns_without_should_stop(tagger, options):
    sentences = [LONG, *SHORT]
    asked = Asked()
    for with_it, without in zip(tagger.tag(sentences, should_stop=asked, **options), tagger.tag(sentences, **options)):
        same(with_it, without)
    assert len(asked.times) > 1


def test_a_stopped_prediction_raises_at_the_check_that_said_so_and_checks_often(tagger):
    tagger.tag(SHORT)  # a first call's one-off costs (imports) are not the prediction's

    def longest_stretch() -> tuple[float, Asked, float]:  # the longest time between checks, as a share of the call
        gc.collect()  # a full collection of the test session's heap is not the prediction's
        began = time.perf_counter()
        asked = Asked()
        tagger.tag([LONG, *SHORT], nbest=20, should_stop=asked)
        seconds = time.perf_counter() - began
        return float(np.diff([began, *asked.times]).max()) / seconds, asked, seconds

    share, full, seconds = longest_stretch()
    # every long loop checks: the chain over the whole sentence alone has 5,000 / CHECK_STEPS steps
    # between checks in each of its forward, backward and k-best passes
    assert len(full.times) > 3 * len(LONG) // CHECK_STEPS, len(full.times)
    # no long stretch between two checks: the longest is ~5% of the call (k-best Viterbi alone, were
    # its loop unchecked, is ~40%, in every call). A pause of the machine or the interpreter can
    # lengthen one stretch of one call: the best of three calls is what the code does.
    shares = [share]
    while min(shares) >= 0.2 and len(shares) < 3:
        shares.append(longest_stretch()[0])
    assert min(shares) < 0.2, shares
    for stop_at in (1, len(full.times) // 3, 2 * len(full.times) // 3, len(full.times)):
        asked = Asked(stop_at)
        with pytest.raises(Cancelled):
            tagger.tag([LONG, *SHORT], nbest=20, should_stop=asked)
        assert len(asked.times) == stop_at  # raised at that check, nothing asked after it
    began = time.perf_counter()
    with pytest.raises(Cancelled):
        tagger.tag([LONG, *SHORT], nbest=20, should_stop=lambda: True)
    assert time.perf_counter() - began < 0.1 * seconds  # already set: before any prediction work


def test_should_stop_is_the_calling_context_s_and_a_nested_none_keeps_it():
    check_cancelled()  # outside any: never
    with stopping_when(lambda: True):
        with pytest.raises(Cancelled):
            check_cancelled()
        with stopping_when(None), pytest.raises(Cancelled):
            check_cancelled()
        with stopping_when(lambda: False):
            check_cancelled()
    check_cancelled()

"""Probabilities users can act on (issue 19): entity calibration, selective prediction, n-best
coverage and the cost of exact span probabilities, gpseq against CRFsuite, in the same run.

    python benchmarks/trust.py [--json OUT] [--quick] [--only NAME ...]

Corpora: `conll2000-chunk` (CoNLL-2000 train.txt → test.txt, features preset chunking) and
`crfpp-japanesene` (CRF++ JapaneseNE train.data → test.data, EUC-JP, preset ner).

Systems, trained in this process:
- `gpseq`: `Tagger.train(train, TaggerConfig(features=get_preset(PRESET), tag_scheme=detected))`,
  what `gpseq train TRAIN --features PRESET` runs (MAP + Laplace, dev-fitted calibration), then
  `Tagger.tag(test)` with default settings (the deterministic predictive).
- `crfsuite`: sklearn-crfsuite, L-BFGS, c1 = c2 = 0.1, 100 iterations, all_possible_transitions,
  on the full training file with gpseq's feature strings (benchmarks/_common.py), as
  benchmarks/versus_crf.py. Its chain (state and transition weights read back from the model)
  gives exact span probabilities by the same constrained forward–backward as gpseq's
  (`gpseq.structured.spans.ChainPosterior`); its token marginals from that chain are checked
  against CRFsuite's own (`crfsuite_marginal_max_diff`).
- `crfsuite_t`: the same CRF trained on train minus the 10 % dev split
  (`train_dev_split(len(train), 0.1, seed=0)`), its chain's potentials divided by one temperature
  T fitted on that dev split (token NLL of the chain's marginals): CRFsuite + T for spans.

For each system, spans = the chunks of its returned labels; span probability = exact (the chain)
and `product` (Π of the token marginals of the span's labels, the approximation gpseq used
before). Metrics (gpseq/evaluation/trust.py): entity-level ECE (15 bins), Brier, AURC, error at 80/90/95 %
coverage of spans ranked by probability; the same for tokens (returned label's marginal); ECE by
frequency band (types with < 5 % of the gold spans are "rare"); n-best coverage calibration for
k = 1, 2, 5, 10 (fraction of test sentences whose gold path is among the k best against the mean
summed probability of those k; gpseq: `tag(nbest=10)`; CRFsuite: k-best Viterbi of its chain);
timing: `Tagger.tag(test, spans="product")` (token marginals, the product needs nothing else)
against `Tagger.tag(test)` (exact span probabilities), each the best of 3 runs after a warm-up.

sequence_log_prob: the default predictive is deterministic, so the returned path's probability
is exact for it. Under the Monte Carlo predictive (`samples=16`) the log-mean-exp estimate is
biased low; `mc_bias_plain` / `mc_bias_corrected` measure it (and the delta-method correction) on
the first 200 test sentences against a reference of 2,048 draws, averaged over 8 seeds, nats per
sentence (the reference's own bias is ~1/128 of the 16-draw estimate's); `deterministic_minus_mc_reference` is the mean gap between the deterministic
predictive's log p(path) and that reference (two different predictives, not an estimator bias).

--quick: CoNLL-2000 cut to 1,000 training / 300 test sentences, JapaneseNE test to 200, the
Monte Carlo bias on 50 sentences against 512 draws, 4 seeds; never commit quick figures as results.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import corpora_root, crfsuite_features, crfsuite_marginals, machine  # noqa: E402

from gpseq.corpora import detect_scheme, read_conll, spans, train_dev_split  # noqa: E402
from gpseq.evaluation.evaluate import expected_calibration_error  # noqa: E402
from gpseq.evaluation.trust import entity_report, nbest_coverage, selective_summary, token_band_report  # noqa: E402
from gpseq.structured.spans import ChainPosterior, SpanScheme, span_queries  # noqa: E402

CRF_PARAMS = dict(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)
NBEST = 10
BIAS_SENTENCES, BIAS_REFERENCE_DRAWS = 200, 2048
KS = (1, 2, 5, 10)
CORPORA = {  # name: (train, test, preset, encoding)
    "conll2000-chunk": ("conll2000/train.txt", "conll2000/test.txt", "chunking", "utf-8"),
    "crfpp-japanesene": ("crfpp/JapaneseNE/train.data", "crfpp/JapaneseNE/test.data", "ner", "euc-jp"),
}


# ---- CRFsuite's chain -------------------------------------------------------------------------
class CrfChain:
    """A fitted sklearn_crfsuite.CRF as a linear chain over `labels`: per-token unaries from its state
    weights, transitions from its transition weights (labels it never saw get −1e4)."""

    def __init__(self, crf, labels, temperature: float = 1.0):
        self.labels = list(labels)
        self.temperature = temperature
        index = {label: v for v, label in enumerate(self.labels)}
        V = len(self.labels)
        self.state = {}
        for (attr, label), weight in crf.state_features_.items():
            if label in index:
                self.state.setdefault(attr, np.zeros(V))[index[label]] += weight
        self.pairwise = np.full((V, V), 0.0)
        for (a, b), weight in crf.transition_features_.items():
            if a in index and b in index:
                self.pairwise[index[a], index[b]] = weight
        self.unseen = np.array([label not in set(crf.classes_) for label in self.labels])

    def unary(self, x) -> np.ndarray:
        out = np.zeros((len(x), len(self.labels)))
        for t, features in enumerate(x):
            for attr, value in features.items():
                weights = self.state.get(attr)
                if weights is not None:
                    out[t] += value * weights
        out[:, self.unseen] = -1e4
        return out

    def posteriors(self, X, batch: int = 256):
        """Yields (sentence ids, ChainPosterior) over batches of sentences of similar length."""
        order = np.argsort([len(x) for x in X], kind="stable")
        for first in range(0, len(order), batch):
            ids = order[first:first + batch]
            T = max(len(X[i]) for i in ids)
            unary = np.zeros((len(ids), T, len(self.labels)))
            for row, i in enumerate(ids):
                unary[row, :len(X[i])] = self.unary(X[i])
            yield ids, ChainPosterior(unary / self.temperature, self.pairwise / self.temperature,
                                      [len(X[i]) for i in ids])


def fit_chain_temperature(chain: CrfChain, X, sentences) -> float:
    """T minimising the dev token NLL of the chain's marginals at potentials / T (grid, then refined)."""
    index = {label: v for v, label in enumerate(chain.labels)}
    gold = [np.array([index.get(label, -1) for label in s.labels]) for s in sentences]

    def nll(log_t: float) -> float:
        total, count = 0.0, 0
        probe = CrfChain.__new__(CrfChain)
        probe.__dict__.update(chain.__dict__, temperature=math.exp(log_t))
        for ids, post in probe.posteriors(X):
            marg = post.token_marginals()
            for row, i in enumerate(ids):
                g = gold[i]
                p = np.where(g >= 0, marg[row, np.arange(len(g)), np.maximum(g, 0)], 0.0)
                total += float(-np.log(np.maximum(p, 1e-12)).sum())
                count += len(g)
        return total / count

    grid = np.linspace(math.log(0.25), math.log(4.0), 17)
    values = [nll(g) for g in grid]
    best = int(np.argmin(values))
    fine = np.linspace(grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)], 9)
    values = [nll(g) for g in fine]
    return float(math.exp(fine[int(np.argmin(values))]))


def crf_system(crf, chain: CrfChain, X, test, scheme_name: str) -> dict:
    """Labels, exact and product span probabilities, token confidences and n-best of a CRF on `test`."""
    labels = chain.labels
    scheme = SpanScheme.build(labels, scheme_name)
    predicted = [list(crf.predict_single(x)) for x in X]
    out = {"labels": predicted, "spans": [None] * len(test), "product": [None] * len(test),
           "confidence": [None] * len(test), "nbest_ranks": [None] * len(test), "nbest_probs": [None] * len(test)}
    index = {label: v for v, label in enumerate(labels)}
    own = crfsuite_marginals(crf, X, labels)
    max_diff = 0.0
    for ids, post in chain.posteriors(X):
        marg = post.token_marginals()
        found = [spans(predicted[i], scheme_name) for i in ids]
        probs = post.span_probs(scheme, span_queries(scheme, found))
        paths, log_probs = post.nbest(NBEST)
        position = 0
        for row, i in enumerate(ids):
            T = len(test[i])
            max_diff = max(max_diff, float(np.abs(marg[row, :T] - own[i]).max()))
            chosen = np.array([index[label] for label in predicted[i]])
            confidence = marg[row, np.arange(T), chosen]
            out["confidence"][i] = confidence
            out["spans"][i] = [(*span, float(p)) for span, p in zip(found[row], probs[position:position + len(found[row])])]
            out["product"][i] = [(*span, float(np.prod(confidence[span[1]:span[2]]))) for span in found[row]]
            position += len(found[row])
            gold = [index.get(label, -1) for label in test[i].labels]
            out["nbest_ranks"][i] = gold_rank(paths[row, :, :T], gold)
            out["nbest_probs"][i] = np.exp(log_probs[row]).tolist()
    out["marginal_max_diff"] = max_diff
    return out


def gold_rank(paths: np.ndarray, gold: list[int]):
    """0-based rank of the gold path among `paths [k, T]`, None if absent."""
    matches = np.flatnonzero(np.all(paths == np.asarray(gold)[None], axis=1))
    return int(matches[0]) if len(matches) else None


# ---- gpseq --------------------------------------------------------------------------------------
def gpseq_system(tagger, test) -> dict:
    results = tagger.tag(test, nbest=NBEST)
    product = tagger.tag(test, spans="product")
    index = tagger.label_index
    out = {"labels": [r.labels for r in results], "spans": [r.spans for r in results],
           "product": [r.spans for r in product], "confidence": [np.array(r.confidences) for r in results],
           "nbest_ranks": [], "nbest_probs": []}
    for sentence, result in zip(test, results):
        gold = [index.get(label, -1) for label in sentence.labels]
        paths = np.array([[index[label] for label in labels] for labels, _ in result.nbest])
        out["nbest_ranks"].append(gold_rank(paths, gold))
        out["nbest_probs"].append([p for _, p in result.nbest])
    return out


def timing(tagger, test, repeats: int = 3) -> dict:
    tagger.tag(test[:8])
    tagger.tag(test[:8], spans="product")
    product_s, exact_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        tagger.tag(test, spans="product")
        product_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        tagger.tag(test)
        exact_s.append(time.perf_counter() - start)
    return {"tag_marginals_s": min(product_s), "tag_exact_spans_s": min(exact_s),
            "exact_span_time_ratio": min(exact_s) / min(product_s)}


def mc_bias(tagger, sentences, samples: int = 16, reference_draws: int = 4096, seeds: int = 8) -> dict:
    """Bias (nats per sentence) of log p(returned path) under the Monte Carlo predictive with `samples`
    draws, plain and delta-corrected, against a `reference_draws` estimate; and the deterministic
    predictive's log p(path) minus that reference."""
    deterministic = tagger.tag(sentences, mean=True, spans="product")
    paths = [[tagger.label_index[label] for label in r.labels] for r in deterministic]
    chunk = 64
    reference = np.full(len(sentences), -np.inf)
    for seed in range(reference_draws // chunk):
        for ids, posterior in tagger.posteriors(sentences, samples=chunk, seed=1000 + seed):
            batch_paths = padded(paths, ids, posterior.shape[2])
            reference[ids] = np.logaddexp(reference[ids], posterior.path_log_probs(batch_paths))
    reference -= math.log(reference_draws // chunk)
    plain, corrected = np.zeros(len(sentences)), np.zeros(len(sentences))
    for seed in range(seeds):
        for ids, posterior in tagger.posteriors(sentences, samples=samples, seed=seed):
            batch_paths = padded(paths, ids, posterior.shape[2])
            plain[ids] += posterior.path_log_probs(batch_paths) / seeds
            corrected[ids] += posterior.path_log_probs(batch_paths, bias_corrected=True) / seeds
    return {"mc_samples": samples, "mc_reference_draws": reference_draws, "mc_bias_sentences": len(sentences),
            "mc_bias_plain": float(np.mean(plain - reference)),
            "mc_bias_corrected": float(np.mean(corrected - reference)),
            "deterministic_minus_mc_reference": float(np.mean([r.sequence_log_prob for r in deterministic]
                                                              - reference))}


def padded(paths, ids, T):
    out = np.zeros((len(ids), T), dtype=np.int64)
    for row, i in enumerate(ids):
        out[row, :len(paths[i])] = paths[i]
    return out


# ---- metrics ------------------------------------------------------------------------------------
def metrics(system: dict, test, scheme_name: str) -> dict:
    gold_spans = [spans(list(s.labels), scheme_name) for s in test]
    out = entity_report(gold_spans, system["spans"], product=system["product"])
    out.pop("entity_calibration", None)
    confidence = np.concatenate(system["confidence"])
    correct = np.array([g == p for s, labels in zip(test, system["labels"]) for g, p in zip(s.labels, labels)])
    out["token_ece"] = expected_calibration_error(confidence, correct)
    out.update({f"token_{k}": v for k, v in selective_summary(confidence, correct).items()})
    out.update(token_band_report([list(s.labels) for s in test], system["labels"], confidence))
    out.update(nbest_coverage(system["nbest_ranks"], system["nbest_probs"], KS))
    predicted = sum(len(s) for s in system["spans"])
    gold = sum(len(g) for g in gold_spans)
    correct_spans = sum(len({sp[:3] for sp in found} & set(g)) for found, g in zip(system["spans"], gold_spans))
    out["chunk_f1"] = 2 * correct_spans / (predicted + gold) if predicted + gold else None
    return out


def run_corpus(name: str, args) -> dict:
    import sklearn_crfsuite

    from gpseq.features import Featurizer, get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    train_path, test_path, preset, encoding = CORPORA[name]
    root = corpora_root()
    train = read_conll(root / train_path, encoding=encoding)
    test = read_conll(root / test_path, encoding=encoding)
    if args.quick:
        train, test = (train[:1000], test[:300]) if name.startswith("conll") else (train, test[:200])
    scheme_name = detect_scheme([list(s.labels) for s in train]) or "iob2"
    out = {"train_sentences": len(train), "test_sentences": len(test), "test_tokens": sum(len(s) for s in test),
           "features": preset, "scheme": scheme_name}
    print(f"== {name}: {len(train)} train / {len(test)} test sentences, scheme {scheme_name}", flush=True)

    start = time.perf_counter()
    tagger = Tagger.train(train, TaggerConfig(features=get_preset(preset), tag_scheme=scheme_name))
    out["gpseq_train_s"] = time.perf_counter() - start
    print(f"  gpseq trained in {out['gpseq_train_s']:.1f} s", flush=True)
    start = time.perf_counter()
    systems = {"gpseq": gpseq_system(tagger, test)}
    print(f"  gpseq tagged (spans, product, 10-best) in {time.perf_counter() - start:.1f} s", flush=True)
    out.update({f"gpseq/{k}": v for k, v in timing(tagger, test).items()})
    print(f"  timing: exact spans {out['gpseq/exact_span_time_ratio']:.2f}x token marginals", flush=True)
    start = time.perf_counter()
    if args.quick:
        bias = mc_bias(tagger, test[:50], reference_draws=512, seeds=4)
    else:
        bias = mc_bias(tagger, test[:BIAS_SENTENCES], reference_draws=BIAS_REFERENCE_DRAWS)
    out.update({f"gpseq/{k}": v for k, v in bias.items()})
    print(f"  Monte Carlo bias measured in {time.perf_counter() - start:.1f} s", flush=True)

    featurizer = Featurizer(get_preset(preset)).fit(train)
    for system, part in (("crfsuite", train), ("crfsuite_t", None)):
        if part is None:
            train_ids, dev_ids = train_dev_split(len(train), 0.1, seed=0)
            part, dev = [train[i] for i in train_ids], [train[i] for i in dev_ids]
        start = time.perf_counter()
        crf = sklearn_crfsuite.CRF(**CRF_PARAMS)
        crf.fit(crfsuite_features(featurizer, part), [list(s.labels) for s in part])
        chain = CrfChain(crf, sorted(crf.classes_))
        if system == "crfsuite_t":
            chain.temperature = fit_chain_temperature(chain, crfsuite_features(featurizer, dev), dev)
            out["crfsuite_t/temperature"] = chain.temperature
        out[f"{system}/train_s"] = time.perf_counter() - start
        print(f"  {system} trained in {out[f'{system}/train_s']:.1f} s", flush=True)
        systems[system] = crf_system(crf, chain, crfsuite_features(featurizer, test), test, scheme_name)
        max_diff = systems[system].pop("marginal_max_diff")
        if system == "crfsuite":  # the tempered chain's marginals differ from CRFsuite's by design
            out[f"{system}/crfsuite_marginal_max_diff"] = max_diff
    for system, data in systems.items():
        for key, value in metrics(data, test, scheme_name).items():
            out[f"{system}/{key}"] = value
    return {f"{name}/{key}": value for key, value in out.items()}


ROWS = ("chunk_f1", "entity_ece", "entity_ece_product", "entity_brier", "entity_brier_product",
        "entity_ece_frequent", "entity_ece_rare", "entity_aurc", "entity_error_at_80", "entity_error_at_90",
        "entity_error_at_95", "token_ece", "token_aurc", "token_error_at_80", "token_error_at_90",
        "token_error_at_95", "nbest_coverage_1", "nbest_claimed_1", "nbest_coverage_5", "nbest_claimed_5",
        "nbest_coverage_10", "nbest_claimed_10", "nbest_ece_10")


def table(name: str, results: dict) -> str:
    lines = [f"== {name}", f"{'':<24}" + "".join(f"{s:>13}" for s in ("gpseq", "crfsuite", "crfsuite_t"))]
    for row in ROWS:
        cells = [results.get(f"{name}/{s}/{row}") for s in ("gpseq", "crfsuite", "crfsuite_t")]
        lines.append(f"{row:<24}" + "".join(f"{c:>13.4f}" if isinstance(c, float) else f"{'-':>13}" for c in cells))
    for key in ("tag_marginals_s", "tag_exact_spans_s", "exact_span_time_ratio", "mc_bias_plain",
                "mc_bias_corrected", "deterministic_minus_mc_reference"):
        value = results.get(f"{name}/gpseq/{key}")
        if value is not None:
            lines.append(f"gpseq {key:<36} {value:.4f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the flat JSON results here")
    parser.add_argument("--quick", action="store_true", help="reduced run (see above)")
    parser.add_argument("--only", nargs="+", choices=sorted(CORPORA), help="corpora to run")
    args = parser.parse_args()
    results = {"meta/machine": machine(), "meta/date": date.today().isoformat(), "meta/quick": args.quick,
               "meta/command": " ".join(["python", "benchmarks/trust.py", *sys.argv[1:]])}
    for name in args.only or sorted(CORPORA):
        results.update(run_corpus(name, args))
        print(table(name, results), flush=True)
    for name in args.only or sorted(CORPORA):
        for alternative in ("gpseq/entity_ece_product", "crfsuite/entity_ece", "crfsuite_t/entity_ece"):
            ours, theirs = results.get(f"{name}/gpseq/entity_ece"), results.get(f"{name}/{alternative}")
            if ours is not None and theirs is not None:
                results[f"targets/{name}/entity_ece_below_{alternative.replace('/', '_')}"] = ours < theirs
        ratio = results.get(f"{name}/gpseq/exact_span_time_ratio")
        if ratio is not None:
            results[f"targets/{name}/exact_spans_within_1.5x"] = ratio <= 1.5
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()

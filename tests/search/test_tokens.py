"""Every method's token count is the sum of the tokens it decoded, on the shipped arith-demo model."""

import pytest
import torch

from grpokit.config.schema import build_config
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.search import beam as beam_module
from grpokit.search import kept_cache
from grpokit.search.beam import beam
from grpokit.search.best_of_n import best_of_n
from grpokit.search.common import Completion
from grpokit.search.decode import Decoder
from grpokit.search.greedy import greedy
from grpokit.search.majority import majority
from grpokit.search.mcts import mcts
from grpokit.search.scorers import VerifierSteps, process_scorer
from grpokit.tasks import Example
from grpokit.train.evaluate import evaluate


class Counting(Decoder):
    """The real decoder, keeping every completion and step it hands out."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.decoded = []

    def complete(self, prompts, n, *, greedy=False):
        groups = super().complete(prompts, n, greedy=greedy)
        self.decoded += [c for g in groups for c in g]
        return groups

    def extend(self, prefixes, n, limits, separator):
        groups = super().extend(prefixes, n, limits, separator)
        self.decoded += [c for g in groups for c in g]
        return groups


@pytest.fixture(scope="module")
def setup():
    cfg = build_config({"model.name_or_path": "builtin:arith-demo", "model.device": "cpu",
                        "rollout.max_completion_length": 24, "run.progress": False})
    model, tokenizer = load_model_and_tokenizer(cfg.model)
    examples = [Example(f"What is {a}+{b}?", str(a + b), {"answer": str(a + b), "task_format": "boxed"})
                for a, b in ((12, 30), (45, 45), (71, 19), (33, 58))]
    return cfg, model, tokenizer, examples


RUNS = {
    "greedy": lambda d, ex: greedy(d, ex),
    "majority": lambda d, ex: majority(d, ex, 3),
    "best-of-n": lambda d, ex: best_of_n(d, ex, 3, process_scorer(VerifierSteps(". "), "min")),
    "beam": lambda d, ex: beam(d, ex, 2, process_scorer(VerifierSteps(". "), "last"), ". ", expand=2),
    "beam-kept": lambda d, ex: beam(d, ex, 2, process_scorer(VerifierSteps(". "), "last"), ". ", expand=2),
    "mcts": lambda d, ex: mcts(d, ex, 4, process_scorer(VerifierSteps(". "), "min"), ". ", width=2),
}


@pytest.mark.parametrize("method", list(RUNS))
def test_tokens_are_the_sum_of_the_decoded_tokens(setup, method, monkeypatch):
    cfg, model, tokenizer, examples = setup
    dec = Counting(model, tokenizer, cfg)
    # "beam" takes the readable path (Decoder.extend); "beam-kept" keeps each problem's cache, whose
    # rounds are counted here as the decoder's steps
    monkeypatch.setattr(beam_module, "KEEP_CACHE", method == "beam-kept")
    rounds = kept_cache.decode_round

    def counted_round(*args, **kwargs):
        steps = rounds(*args, **kwargs)
        dec.decoded += [Completion(tokenizer.decode(ids, skip_special_tokens=True), len(ids),
                                   ids[-1] in dec.eos_ids, ids) for ids, _ in steps]
        return steps
    monkeypatch.setattr(kept_cache, "decode_round", counted_round)
    torch.manual_seed(0)
    results = RUNS[method](dec, examples)
    assert len(results) == len(examples)
    assert sum(r.tokens for r in results) == sum(c.tokens for c in dec.decoded) > 0
    for c in dec.decoded:   # a character per token, and the EOS when the row ended with it
        assert c.tokens == len(c.text) + (1 if c.ended else 0)
    if method == "greedy":
        assert len(dec.decoded) == len(examples)
    elif method in ("majority", "best-of-n"):
        assert len(dec.decoded) == 3 * len(examples)
    elif method.startswith("beam"):   # round 0 expands the empty solution 2 x 2 times, then 1 or 2 live x 2
        rounds = [r.extra["rounds"] for r in results]
        assert sum(4 + 2 * (n - 1) for n in rounds) <= len(dec.decoded) <= sum(4 * n for n in rounds)
        kept = [r.extra["prefill_tokens"] == len(dec.prompt_ids(ex.prompt))
                for r, ex in zip(results, examples)]
        assert all(kept) if method == "beam-kept" else not any(kept)


def test_greedy_matches_evaluates_accuracy(setup):
    cfg, model, tokenizer, examples = setup
    results = greedy(Decoder(model, tokenizer, cfg), examples)
    reference = evaluate(model, tokenizer, examples, cfg, progress=False)
    assert sum(r.correct for r in results) / len(results) == reference["accuracy"]
    assert sum(r.tokens for r in results) / len(results) == pytest.approx(reference["completion_length_mean"])

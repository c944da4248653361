"""Beam search's kept KV cache: rows forked, fed and decoded over rounds give the log-probs of a fresh
forward pass over prompt + solution, on every decoder path (PyTorch ops, the one-call C step, the per-layer
C kernels with the prompt's slots shared), and a beam run with it matches the readable path."""

import contextlib

import pytest
import torch

from grpokit import switch
from grpokit.config.schema import build_config
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.model.logprobs import per_token_logprobs
from grpokit.rollout import decode_linear
from grpokit.search import beam as beam_module
from grpokit.search.beam import beam
from grpokit.search.decode import Decoder
from grpokit.search.kept_cache import KeptRows, decode_round
from grpokit.search.scorers import VerifierSteps, process_scorer
from grpokit.tasks import Example

TEMPERATURE = 0.9


def never(ids):
    return False


@contextlib.contextmanager
def decoder_path(path: str, monkeypatch):
    """plain: PyTorch ops; whole: the one-call C step where it applies; shared: per-layer C kernels with
    every weight packed (no one-call step), so the prompt's slots are kept once and shared by the rows."""
    if path == "shared":
        monkeypatch.setattr(decode_linear, "PACK_MIN_ELEMENTS", 1)
    with (switch.plain() if path == "plain" else switch.accelerated(torch.nn.Linear(1, 1))):
        yield


def rounds(model, prompt: list[int]) -> tuple[KeptRows, list[tuple[list[int], list[float]]]]:
    """Three rounds by hand: 4 rows of unequal lengths, a fork that copies one row twice and drops one,
    then a fork down to 2 rows. Returns the cache and each final row's whole (ids, log-probs)."""
    rows = KeptRows(model, prompt, 4, limit=16)
    torch.manual_seed(0)
    paths = decode_round(rows, rows.first.expand(4, -1), [3, 5, 1, 4], never, temperature=TEMPERATURE,
                         top_p=1.0, top_k=0)
    for parents, limits in (([1, 1, 3, 0], [4, 2, 3, 5]), ([2, 0], [3, 6])):
        rows.fork(parents)
        pending = torch.tensor([paths[p][0][-1] for p in parents])
        logits = rows.step(pending, torch.ones(len(parents), dtype=torch.bool))
        steps = decode_round(rows, logits, limits, never, temperature=TEMPERATURE, top_p=1.0, top_k=0)
        paths = [(paths[p][0] + ids, paths[p][1] + lps) for p, (ids, lps) in zip(parents, steps)]
    return rows, paths


@pytest.mark.parametrize("path", ["plain", "whole", "shared"])
def test_forked_rows_give_the_logprobs_of_a_fresh_pass(tiny_model, char_tokenizer, path, monkeypatch):
    prompt = char_tokenizer("What is 12+30?")["input_ids"]
    with decoder_path(path, monkeypatch):
        rows, paths = rounds(tiny_model, prompt)
    assert (rows.dec.base == len(prompt)) == (path == "shared")       # the prompt's slots kept once
    assert [len(ids) for ids, _ in paths] == [4 + 3 + 3, 5 + 4 + 6]   # via rows 3, 2 and 1, 0
    assert rows.n == 2 and rows.pos.tolist() == [len(prompt) + 9, len(prompt) + 14]   # last id pending
    for ids, lps in paths:
        full = torch.tensor([prompt + ids])
        want = per_token_logprobs(tiny_model, full, torch.ones_like(full), len(ids), temperature=TEMPERATURE)
        assert torch.allclose(torch.tensor(lps), want[0], atol=1e-4), path


def test_a_fork_packs_each_rows_slots_and_masks_the_rest(tiny_model, char_tokenizer):
    prompt = char_tokenizer("7*8?")["input_ids"]
    P = len(prompt)
    rows = KeptRows(tiny_model, prompt, 3, limit=8)
    torch.manual_seed(0)
    steps = decode_round(rows, rows.first.expand(3, -1), [2, 5, 3], never, temperature=1.0, top_p=1.0,
                         top_k=0)
    # lockstep: 4 slots were written (the 5-token row's first 4 ids); rows read 1, 4 and 2 of them
    assert rows.slot == P + 4 and rows.key_mask[:, P:P + 4].sum(-1).tolist() == [1, 4, 2]
    assert [len(ids) for ids, _ in steps] == [2, 5, 3]
    rows.fork([2, 0])
    # packed to end at one slot: row 0 (from row 2) reads 2 solution slots, row 1 (from row 0) one
    assert rows.slot == P + 2 and rows.key_mask[:, P:P + 2].tolist() == [[True, True], [False, True]]
    assert rows.key_mask[:, :P].all() and rows.pos.tolist() == [P + 2, P + 1]


@pytest.fixture(scope="module")
def demo():
    cfg = build_config({"model.name_or_path": "builtin:arith-demo", "model.device": "cpu",
                        "rollout.max_completion_length": 24, "rollout.top_k": 1, "run.progress": False})
    model, tokenizer = load_model_and_tokenizer(cfg.model)
    examples = [Example(f"What is {a}+{b}?", str(a + b), {"answer": str(a + b), "task_format": "boxed"})
                for a, b in ((12, 30), (45, 45), (71, 19))]
    return Decoder(model, tokenizer, cfg), examples


def test_kept_beam_equals_the_readable_beam_when_sampling_is_deterministic(demo, monkeypatch):
    """top_k = 1: every draw is the argmax, so both paths must choose the same completions, with the same
    rounds and token counts; only the prefill differs (the prompt once, against every beam each round)."""
    dec, examples = demo
    scorer = process_scorer(VerifierSteps(". "), "last")
    runs = {}
    for keep in (True, False):
        monkeypatch.setattr(beam_module, "KEEP_CACHE", keep)
        runs[keep] = beam(dec, examples, 2, scorer, ". ", expand=2)
    for kept, readable, ex in zip(runs[True], runs[False], examples):
        assert (kept.completion, kept.tokens, kept.correct) == (readable.completion, readable.tokens,
                                                                readable.correct)
        for key in ("rounds", "score"):
            assert kept.extra[key] == readable.extra[key]
        prompt_len = len(dec.prompt_ids(ex.prompt))
        assert kept.extra["prefill_tokens"] == prompt_len < readable.extra["prefill_tokens"]

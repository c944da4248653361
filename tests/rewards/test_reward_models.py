"""Scoring with learned reward models: the outcome RM, the process RM, `rm:PATH` in a config, their errors.

Tiny random-init Qwen2 classifiers built from a config and offline tokenizers; nothing is downloaded.
"""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

from grpokit.config.schema import RMConfig, build_config
from grpokit.core.advantages import process_advantages
from grpokit.model.loading import build_char_tokenizer, tiny_config
from grpokit.rewards.calls import RewardError
from grpokit.rewards.outcome_rm import RewardModel, load_reward_model, reward_model_for
from grpokit.rewards.process_rm import ProcessRewardModel, policy_token
from grpokit.rewards.rm_batch import rm_device
from grpokit.rewards.rm_data import RMSample
from grpokit.rewards.rm_train import init_reward_model, save_reward_model, score_samples
from grpokit.rewards.scoring import get_reward_function, score_responses
from grpokit.rewards.steps import token_char_ends
from grpokit.train.loop import train_grpo
from grpokit.trl.inputs import reward_triples

AUTO = {"outcome": AutoModelForSequenceClassification, "process": AutoModelForTokenClassification}


def tiny_rm(tok, kind: str = "outcome", seed: int = 0, labels: int = 1, positions: int = 256):
    config = tiny_config(len(tok), tokenizer=tok, max_positions=positions)
    config.num_labels = labels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AUTO[kind].from_config(config).eval()


def save_rm(folder, tok, kind: str = "outcome", meta: bool = True, **kw):
    tiny_rm(tok, kind, **kw).save_pretrained(folder)
    tok.save_pretrained(folder)
    if meta:
        (folder / "grpokit_rm.json").write_text(json.dumps(
            {"kind": kind, "step_separator": "\n", "init": "random", "report": {}}))
    return folder


def word_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """Numbers and words are one token each, any other char its own: cuts text unlike the char tokenizer."""
    split = pre_tokenizers.Split(Regex(r"\d+|[a-z]+|.|\n"), behavior="isolated")
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for text in texts:
        for piece, _ in split.pre_tokenize_str(text):
            vocab.setdefault(piece, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = split
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def manual_outcome_logit(model, tok, text: str) -> float:
    """The head over the backbone's last hidden state at the last token: no padding, no pooling code."""
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state    # [1, L, H]
        return float(model.score(hidden)[0, -1, 0])


def test_outcome_scores_equal_a_manual_forward_in_a_batch_of_different_lengths():
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    model = tiny_rm(tok)
    prompts = ["1+2=", "What is 12*12? ", [{"role": "user", "content": "7-5?"}]]
    completions = ["3", "144 so \\boxed{144}", [{"role": "assistant", "content": "2"}]]
    # the RM's own texts (its chat template for the chat prompt)
    texts = ["1+2=3", "What is 12*12? 144 so \\boxed{144}", "<user>7-5?\n<assistant>2\n"]
    got = RewardModel(model, tok, batch_size=2)(prompts=prompts, completions=completions)  # 2 batches, padded
    want = [manual_outcome_logit(model, tok, t) for t in texts]
    assert got == pytest.approx(want, abs=1e-5)
    assert len({round(x, 6) for x in got}) == 3  # not one constant


def test_sigmoid_transform_and_bf16_autocast(char_tokenizer):
    model = tiny_rm(char_tokenizer)
    args = {"prompts": ["1+1=", "9*9="], "completions": ["2", "81"]}
    raw = RewardModel(model, char_tokenizer)(**args)
    prob = RewardModel(model, char_tokenizer, transform="sigmoid")(**args)
    assert prob == pytest.approx([1 / (1 + math.exp(-x)) for x in raw], abs=1e-6)
    half = RewardModel(model, char_tokenizer, precision="bf16")(**args)
    assert half == pytest.approx(raw, abs=0.05) and half != raw           # bf16 matmuls, close to fp32
    assert next(model.parameters()).dtype == torch.float32               # autocast: the weights stay fp32


def test_scoring_reads_the_model_at_call_time_and_keeps_it_trainable(char_tokenizer):
    model = tiny_rm(char_tokenizer).train()
    rm = RewardModel(model, char_tokenizer)
    args = {"prompts": ["1+1="], "completions": ["2"]}
    before = rm(**args)
    assert model.training and all(p.requires_grad for p in model.parameters())  # its mode is given back
    opt = torch.optim.SGD(rm.model.parameters(), lr=0.5)               # trained in place, as Algorithm 1 does
    ids = torch.tensor([char_tokenizer("1+1=2", add_special_tokens=False)["input_ids"]])
    (-rm.model(input_ids=ids).logits.sum()).backward()
    opt.step()
    after = rm(**args)
    assert after[0] > before[0]
    rm.model = tiny_rm(char_tokenizer, seed=1)                          # a new object is read too
    assert rm(**args) != after


# --- the process RM: steps -> RM tokens and -> policy tokens ---------------------------------------------

PROMPT, COMPLETION, OTHER = "Q:", "12+34=46\n46*2=92\n\\boxed{92}", "7*6=42\n\\boxed{42}"


def test_process_steps_map_to_rm_tokens_and_to_policy_tokens_of_other_tokenizers(char_tokenizer):
    # split_steps(COMPLETION, "\n") -> (0, 9) "12+34=46\n", (9, 17) "46*2=92\n", (17, 27) "\boxed{92}".
    # RM side (word tokenizer) on "Q:" + COMPLETION: Q0 :1 12 2 +3 34 4 =5 46 6 \n7 46 8 *9 2 10 =11 92 12
    # \n13 \ 14 boxed15 {16 92 17 }18: each step is scored at its last non-space char: "46"=6, "92"=12, "}"=18
    # (the "\n" separators 7 and 13 are not scoring positions).
    tok = word_tokenizer([PROMPT + COMPLETION, OTHER])
    model = tiny_rm(tok, "process")
    prm = ProcessRewardModel(model, tok)
    ids = tok(PROMPT + COMPLETION, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :, 0]  # [L]
    steps = prm.score_steps([PROMPT], [COMPLETION])[0]
    assert [e for e, _ in steps] == [9, 17, 27]
    assert [r for _, r in steps] == pytest.approx([float(logits[t]) for t in (6, 12, 18)], abs=1e-5)
    # Policy side, the char tokenizer: one token per char, so a step ends on the token of its last char
    # (the separator included, as steps_reward places it): 8, 16, 26.
    char_ids = char_tokenizer(COMPLETION, add_special_tokens=False)["input_ids"]
    char_ends = token_char_ends(char_tokenizer, char_ids)
    out = prm(prompts=[PROMPT], completions=[COMPLETION], completion_char_ends=[char_ends])[0]
    assert [t for t, _ in out] == [8, 16, 26] and [r for _, r in out] == [r for _, r in steps]
    # A policy with the word tokenizer: 12 + 34 = 46 \n ...,
    # char ends [2,3,5,6,8,9,11,12,13,14,16,17,18,23,24,26,27]: the step ends 9, 17, 27 fall on
    # tokens 5, 11, 16.
    word_ends = token_char_ends(tok, tok(COMPLETION, add_special_tokens=False)["input_ids"])
    assert word_ends == [2, 3, 5, 6, 8, 9, 11, 12, 13, 14, 16, 17, 18, 23, 24, 26, 27]
    assert [policy_token(word_ends, e) for e in (9, 17, 27)] == [5, 11, 16]


class SlowWordTokenizer(PreTrainedTokenizerFast):
    """The same tokenizer seen as one without offset mappings: positions come from incremental decoding."""

    @property
    def is_fast(self) -> bool:
        return False


def test_process_positions_agree_without_offset_mappings():
    fast = word_tokenizer([PROMPT + COMPLETION, OTHER])
    slow = SlowWordTokenizer(tokenizer_object=fast.backend_tokenizer, pad_token="<pad>", eos_token="<eos>",
                             unk_token="<unk>")
    model = tiny_rm(fast, "process")
    completions = [COMPLETION, OTHER]  # a batch of two lengths: the second is right-padded
    want = ProcessRewardModel(model, fast, batch_size=1).score_steps([PROMPT] * 2, completions)
    got = ProcessRewardModel(model, slow, batch_size=2).score_steps([PROMPT] * 2, completions)
    assert [[e for e, _ in s] for s in got] == [[e for e, _ in s] for s in want] == [[9, 17, 27], [7, 17]]
    assert [r for s in got for _, r in s] == pytest.approx([r for s in want for _, r in s], abs=1e-5)


class DigitForTokenClassification(torch.nn.Module):
    """A process RM whose logit at a token is the digit it holds (0 elsewhere): numbers derivable by hand."""

    def __init__(self, tok):
        super().__init__()
        self.config = PretrainedConfig(num_labels=1, max_position_embeddings=64,
                                       pad_token_id=tok.pad_token_id)
        table = torch.zeros(len(tok))
        for d in "0123456789":
            table[tok.convert_tokens_to_ids(d)] = float(d)
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.table[input_ids][..., None])  # [b, L, 1]


def test_process_advantages_from_a_hand_computed_example(char_tokenizer):
    # G = 2, separator "\n", the char tokenizer on both sides (completion token t = char t):
    #   c0 = "x3\ny1": steps "x3\n" (ends at char 3 -> token 2), "y1" (char 5 -> token 4); scores 3, 1
    #   c1 = "z0\nw2": the same tokens 2, 4; scores 0, 2
    # Group step rewards R = [3, 1, 0, 2]: mean 1.5, std (n-1) = sqrt(5/3); r~ = (r - 1.5) / sqrt(5/3),
    # so with s = sqrt(0.6) = 0.7746: r~ = 1.5s, -0.5s, -1.5s, 0.5s.
    # A_{i,t} = sum of r~ of the steps ending at or after t:
    #   c0: t <= 2: 1.5s - 0.5s = s;   t = 3, 4: -0.5s
    #   c1: t <= 2: -1.5s + 0.5s = -s; t = 3, 4: 0.5s
    prm = ProcessRewardModel(DigitForTokenClassification(char_tokenizer), char_tokenizer)
    completions = ["x3\ny1", "z0\nw2"]
    ends = [token_char_ends(char_tokenizer, char_tokenizer(c)["input_ids"]) for c in completions]
    batch = score_responses([("prm", prm, 1.0)], ["P", "P"], completions, {}, completion_char_ends=ends)
    assert batch.step_rewards == [[(2, 3.0), (4, 1.0)], [(2, 0.0), (4, 2.0)]]
    s = math.sqrt(0.6)
    want = torch.tensor([[s, s, s, -0.5 * s, -0.5 * s], [-s, -s, -s, 0.5 * s, 0.5 * s]])
    torch.testing.assert_close(process_advantages(batch.step_rewards, 2, 5), want)


# --- rm:PATH in a config and the Python API ----------------------------------------------------------------

TINY = {"model.name_or_path": "builtin:tiny-random", "rollout.prompts_per_step": 2,
        "rollout.num_generations": 4, "rollout.max_completion_length": 8, "run.max_steps": 2,
        "run.progress": False, "task.num_train": 8, "task.num_eval": 2}


@pytest.mark.parametrize("kind", ["outcome", "process"])
def test_rm_path_in_a_config_trains_two_grpo_steps(kind, tmp_path, char_tokenizer):
    folder = save_rm(tmp_path / "rm", char_tokenizer, kind)
    name = f"rm:{folder}"
    cfg = build_config({**TINY, "reward.funcs": {name: 1.0}, "run.output_dir": str(tmp_path / "run"),
                        "run.eval_limit": 2 if kind == "process" else 0})  # evaluation passes char ends too
    state = train_grpo(cfg)
    scorer = state.reward_funcs[0][1]
    assert isinstance(scorer, RewardModel if kind == "outcome" else ProcessRewardModel)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]  # the training steps (evaluation rows aside)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r[f"rewards/{name}"]) and math.isfinite(r["loss"]) for r in rows)
    assert rows[0]["advantage_std"] > 0  # the RM's scores differ within groups: a learning signal


def test_loader_options_and_the_python_api(tmp_path, char_tokenizer):
    outcome = save_rm(tmp_path / "o", char_tokenizer, meta=False)  # no grpokit_rm.json: by architecture
    process = save_rm(tmp_path / "p", char_tokenizer, "process")
    rm = load_reward_model(outcome, RMConfig(batch_size=3, transform="sigmoid", device="cpu", max_length=50))
    assert (rm.batch_size, rm.transform, rm.max_length, rm.kind) == (3, "sigmoid", 50, "outcome")
    assert isinstance(get_reward_function(str(outcome)), RewardModel)  # a bare folder: an outcome shortcut
    assert RewardModel.from_path(outcome).kind == "outcome"
    prm = get_reward_function(f"rm:{process}", rm=RMConfig(step_separator=". "))
    assert prm.process and prm.step_separator == "\n"  # the separator the folder was trained with wins
    models = [tiny_rm(char_tokenizer), tiny_rm(char_tokenizer, "process"), f"rm:{process}"]
    triples, _ = reward_triples(models, None, [char_tokenizer, char_tokenizer, None])
    kinds = [type(fn).__name__ for _, fn, _ in triples]
    assert kinds == ["RewardModel", "ProcessRewardModel", "ProcessRewardModel"]
    assert isinstance(reward_model_for(tiny_rm(char_tokenizer, "process"), char_tokenizer),
                      ProcessRewardModel)


# --- one-line errors ---------------------------------------------------------------------------------------

def _causal_lm(folder, tok):
    AutoModelForCausalLM.from_config(tiny_config(len(tok), tokenizer=tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _labelled_process(folder):
    (folder / "grpokit_rm.json").write_text('{"kind": "process"}')  # a sequence classifier, "process"
    return folder


BAD_FOLDERS = [
    ("missing", lambda t, tok: t / "nope", "reward model folder '{t}/nope' does not exist"),
    ("no-config", lambda t, tok: (t / "empty").mkdir() or t / "empty", "has no config.json"),
    ("causal-lm", lambda t, tok: _causal_lm(t / "lm", tok), "is a Qwen2ForCausalLM, not a reward model"),
    ("two-labels", lambda t, tok: save_rm(t / "two", tok, labels=2), "has 2 labels"),
    ("kind-mismatch", lambda t, tok: _labelled_process(save_rm(t / "k", tok, meta=False)),
     "is a Qwen2ForSequenceClassification, not a process reward model"),
    ("positions", lambda t, tok: save_rm(t / "short", tok, positions=16), "rm.max_length=32 is more than"),
]


@pytest.mark.parametrize("name, make, expected", BAD_FOLDERS, ids=[c[0] for c in BAD_FOLDERS])
def test_a_bad_reward_model_folder_is_one_line(name, make, expected, tmp_path, char_tokenizer):
    folder = make(tmp_path, char_tokenizer)
    with pytest.raises(RewardError) as e:
        get_reward_function(f"rm:{folder}", rm=RMConfig(max_length=32))
    msg = str(e.value)
    assert expected.format(t=tmp_path) in msg and "\n" not in msg
    if name in ("no-config", "causal-lm", "two-labels"):
        assert "train one with `grpokit rm train`" in msg


def test_overlong_inputs_and_unmappable_steps_are_one_line(char_tokenizer):
    long = ["1+1=" * 10]
    with pytest.raises(RewardError, match=r"has 41 tokens, more than its rm.max_length=20: raise rm.max_len"):
        RewardModel(tiny_rm(char_tokenizer), char_tokenizer, max_length=20)(prompts=long, completions=["2"])
    short = tiny_rm(char_tokenizer, "process", positions=16)
    with pytest.raises(RewardError, match=r"has 41 tokens, more than its max_position_embeddings=16"):
        ProcessRewardModel(short, char_tokenizer)(prompts=long, completions=["2"], completion_char_ends=[[1]])
    with pytest.raises(RewardError, match="needs completion_char_ends"):
        ProcessRewardModel(short, char_tokenizer)(prompts=["1+1="], completions=["2"])
    with pytest.raises(RewardError, match="is a Qwen2ForTokenClassification, not a .ForSequenceClass"):
        RewardModel(short, char_tokenizer)
    with pytest.raises(RewardError, match="transform must be one of none, sigmoid"):
        RewardModel(tiny_rm(char_tokenizer), char_tokenizer, transform="tanh")


@pytest.mark.parametrize("kind", ["outcome", "process"])
def test_scoring_equals_what_rm_training_scores(kind, tmp_path):
    model, tok = init_reward_model("builtin:tiny-random", kind, 0)
    folder = save_reward_model(model, tok, tmp_path / "rm", kind=kind, step_separator="\n", init="tiny",
                               report={})
    prompts = ["What is 12+34? ", "What is 5*6? "]
    completions = ["12+34=46\n\\boxed{46}", "5*6=30\n30+0=30\n\\boxed{30}"]
    samples = [RMSample(prompt=p, completion=c, label=1.0, step_labels=[1.0] * (c.count("\n") + 1),
                        group=str(i)) for i, (p, c) in enumerate(zip(prompts, completions))]
    trained_on, _ = score_samples(model, tok, samples, kind=kind, batch_size=2, step_separator="\n")
    rm = load_reward_model(folder, RMConfig())
    scored = rm(prompts=prompts, completions=completions) if kind == "outcome" else \
        [r for steps in rm.score_steps(prompts, completions) for _, r in steps]
    assert scored == pytest.approx(trained_on, abs=1e-6)


def test_device_option(char_tokenizer):
    rm = RewardModel(tiny_rm(char_tokenizer), char_tokenizer, device="cpu")
    assert (next(rm.model.parameters()).device.type == "cpu"
            and rm_device("auto", "cpu") == torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(RewardError,
                           match="rm.device=cuda:1 but no CUDA device is visible: use rm.device=cpu"):
            RewardModel(tiny_rm(char_tokenizer), char_tokenizer, device="cuda:1")

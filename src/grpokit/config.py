"""One typed config tree for grpokit: defaults, YAML load, dotted CLI overrides, presets, validation.

Defaults are the DeepSeekMath paper's (beta 0.04, epsilon 0.2, one update per generation batch,
group-std scaling, token-level ratio, per-completion token mean). Field names follow Hugging Face
TRL where TRL has the concept (num_generations, beta, epsilon, loss_type, scale_rewards, ...).

    cfg = load_config("cfg.yaml", ["loss.beta=0.0", "preset=dapo"])

Every error raised here is a `ConfigError` whose message is one line naming the field and what to
change, so the CLI can print it without a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .choices import (
    Algorithm,
    AnswerFormat,
    Backend,
    Dtype,
    ImportanceSamplingLevel,
    LossType,
    LRScheduler,
    Optimizer,
    Precision,
    RewardErrors,
    RMObjective,
    RMPrecision,
    RMTransform,
    ScaleRewards,
    StepLabels,
    TaskName,
    TISLevel,
    TruncatePrompt,
    VLLMMode,
)
from .errors import ConfigError, suggest  # ConfigError: public here too (grpokit.config.ConfigError)
from .validation import validate  # the range and consistency checks, one function per concern


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its documentation kept in the metadata (the config reference)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _choice(choice: Any, default: str, before: str = "", after: str = "", **notes: str) -> Any:
    """A field holding one of `choice`'s options (a `grpokit.choices` Literal): its help lists them,
    each with its note, between `before` and `after`; validation checks the value against the same type."""
    listed = " | ".join(f"{o} ({notes[o]})" if o in notes else o for o in typing.get_args(choice))
    return _f(default, before + listed + after)


@dataclass
class ModelConfig:
    name_or_path: str = _f("builtin:arith-demo", "local AutoModelForCausalLM folder, an alias "
                           "(smollm2-135m-instruct), or builtin:arith-demo / builtin:tiny-random")
    gguf_file: str | None = _f(None, "GGUF file name inside name_or_path (needs the [gguf] extra)")
    dtype: Dtype = _choice(Dtype, "float32", after=": the stored weights (16-bit: compute in it too)")
    precision: Precision = _choice(Precision, "auto", after=": compute precision of float32 "
                              "weights; bf16 keeps fp32 master weights and optimizer state, runs the matmuls in "
                              "bfloat16 and the log-softmax/loss in fp32; auto picks bf16 where the device has native "
                              "bf16 matmul and the model is large enough (grpokit.precision)")
    device: str = _f("auto", "auto (cuda if available, else cpu) | cpu | cuda | cuda:N")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward (less memory)")
    lora_r: int = _f(0, "LoRA rank; 0 trains all weights (LoRA needs the [peft] extra)")
    lora_alpha: int = _f(16, "LoRA scaling alpha")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    lora_target_modules: list = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "modules LoRA wraps")


@dataclass
class TaskConfig:
    name: TaskName = _choice(TaskName, "arithmetic", hf="a datasets-readable jsonl / parquet "
                             "file or save_to_disk folder, TRL's format: a prompt column, other columns to the rewards")
    path: str | None = _f(None, "data file or folder for gsm8k / math500 / jsonl / hf")
    train_split: str = _f("train", "split the policy trains on")
    eval_split: str = _f("test", "held-out split for evaluation")
    prompt_column: str = _f("prompt", "jsonl task: column holding the question")
    answer_column: str = _f("answer", "jsonl task: column holding the reference answer")
    digits: int = _f(2, "arithmetic: digits per operand")
    terms: int = _f(2, "arithmetic: operands per problem")
    operators: str = _f("+-", "arithmetic: operators drawn from (subset of +-*)")
    num_train: int = _f(15000, "arithmetic: training problems generated")
    num_eval: int = _f(500, "arithmetic: held-out problems (disjoint from train)")
    seed: int = _f(1234, "arithmetic: generator seed")
    chat_template: bool = _f(False, "render prompts with the tokenizer's chat template")
    chat_template_kwargs: dict = _f({}, "extra keywords for apply_chat_template (e.g. {enable_thinking: false})")
    system_prompt: str | None = _f(None, "system message when chat_template is on")
    format: AnswerFormat = _choice(AnswerFormat, "boxed", boxed="final answer in \\boxed{}",
                                   r1="<think>...</think> then the answer")
    instruction: bool = _f(False, "append an instruction to put the final answer in \\boxed{}")
    few_shot: int = _f(0, "solved train examples prepended to each prompt")


@dataclass
class RolloutConfig:
    num_generations: int = _f(8, "G: completions sampled per prompt")
    prompts_per_step: int = _f(4, "B: prompts per optimizer step (generation batch = B * G)")
    max_prompt_length: int = _f(512, "longest prompt in tokens")
    truncate_prompt: TruncatePrompt = _choice(TruncatePrompt, "left", left="drop the oldest tokens, with a warning")
    max_completion_length: int = _f(256, "T: longest completion in tokens")
    temperature: float = _f(1.0, "sampling temperature (> 0)")
    top_p: float = _f(1.0, "nucleus sampling mass in (0, 1]")
    top_k: int = _f(0, "keep the k most likely tokens; 0 keeps all")
    backend: Backend = _choice(Backend, "auto", fast="grpokit's KV-cache sampler", generate="model.generate")
    generation_batch_size: int = _f(0, "completions decoded at once; 0 = the whole batch")
    reuse_activations: bool | str = _f("auto", "the first update's forward takes the projection outputs the "
                                       "fast sampler computed (grpokit.reuse; one process): auto (models of "
                                       ">= 5M parameters, whole batch per micro-batch) | true | false")
    dynamic_sampling: bool = _f(False, "DAPO: drop groups whose rewards are all equal, resample")
    max_resample_rounds: int = _f(3, "bound on extra generation rounds for dynamic sampling")
    vllm_mode: VLLMMode = _choice(VLLMMode, "colocate", before="backend=vllm: ",
                                  colocate="an LLM engine in each training process, slept during the update",
                                  server="a `grpokit vllm-serve` process, weights pushed each step")
    vllm_gpu_memory_utilization: float = _f(0.3, "backend=vllm colocate: share of GPU memory vLLM may take")
    vllm_server_base_url: str = _f("http://127.0.0.1:8000",
                                   "backend=vllm server: where `grpokit vllm-serve` listens")
    vllm_kv_cache_gib: float = _f(0.0, "backend=vllm colocate: KV-cache budget in GiB; 0 = from "
                                  "vllm_gpu_memory_utilization on GPU, 1 GiB on CPU (vLLM's own CPU default "
                                  "takes most of the RAM)")
    vllm_cpu_threads: int = _f(0, "backend=vllm colocate on CPU: torch threads of the training process, "
                               "which the engine shares (set before it starts; vLLM then forbids changes); "
                               "0 = as is")
    vllm_enforce_eager: bool | str = _f("auto", "backend=vllm colocate: no torch.compile / CUDA graphs: auto "
                                        "(eager on CPU, where compiling costs ~2 min at start; compiled on "
                                        "GPU) | true | false")


@dataclass
class RewardConfig:
    funcs: dict = _f({"rule": 1.0}, "reward name, 'module:function' or 'rm:PATH' (a learned reward model) -> weight")
    reward_errors: RewardErrors = _choice(RewardErrors, "raise", **{"raise": "stop, naming the function",
                                                                    "skip": "score None, count it"})
    overlong_buffer: int = _f(0, "DAPO soft overlong punishment: penalty ramps over the last N tokens")
    overlong_penalty: float = _f(1.0, "penalty at the length limit for the overlong shaping")
    step_correct_reward: float = _f(1.0, "steps (process) reward: an arithmetic step that checks out")
    step_wrong_reward: float = _f(-1.0, "steps (process) reward: a wrong arithmetic step")


@dataclass
class LossConfig:
    loss_type: LossType = _choice(LossType, "grpo", grpo="eq. 3")
    beta: float = _f(0.04, "KL coefficient; 0 loads no reference model")
    epsilon: float = _f(0.2, "clip range low: ratio >= 1 - epsilon")
    epsilon_high: float | None = _f(None, "clip range high (DAPO clip-higher); None = epsilon")
    delta: float | None = _f(None, "optional upper bound on the ratio for negative advantages")
    importance_sampling_level: ImportanceSamplingLevel = _choice(ImportanceSamplingLevel, "token", token="eq. 3",
                                                                 sequence="GSPO")
    scale_rewards: ScaleRewards = _choice(ScaleRewards, "group", none="Dr. GRPO: centre only")
    num_iterations: int = _f(1, "mu: policy updates per generation batch")
    kl_in_reward: bool = _f(False, "subtract beta * KL from the reward instead of the loss")
    use_bias_correction_kl: bool = _f(False, "weight the per-token KL by the importance ratio (gradient "
                                      "through it): the unbiased reverse-KL gradient (TRL's default, "
                                      "DeepSeek-V3.2); False = the paper's k3")
    mask_truncated_completions: bool = _f(False, "completions without EOS contribute no loss")
    ref_model_sync_steps: int = _f(0, "every N steps: ref <- a * policy + (1 - a) * ref; 0 = never")
    ref_model_mixup_alpha: float = _f(1.0, "a in the reference reset (1.0 = the paper's reset)")
    tis_level: TISLevel = _choice(TISLevel, "token", before="backend=vllm: truncated importance sampling of the "
                                  "sampler/trainer mismatch, per ", none="loss.truncated_is_weights")
    tis_cap: float = _f(2.0, "backend=vllm: cap C on the importance weight min(pi_old / pi_sampler, C)")
    algorithm: Algorithm = _choice(Algorithm, "grpo", grpo="group baseline, no critic",
                                   ppo="value-model baseline, for comparison")
    gamma: float = _f(1.0, "ppo: GAE discount gamma")
    lam: float = _f(0.95, "ppo: GAE lambda (gamma = lam = 1 gives A_t = R - V_t)")
    vf_coef: float = _f(0.1, "ppo: value-loss coefficient")
    cliprange_value: float = _f(0.2, "ppo: value predictions clipped to old value +- this")


@dataclass
class OptimConfig:
    learning_rate: float = _f(1e-6, "AdamW learning rate (paper: 1e-6 for pretrained models)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.99, "AdamW beta2")
    max_grad_norm: float = _f(1.0, "gradient clipping norm; 0 disables")
    lr_scheduler_type: LRScheduler = _choice(LRScheduler, "constant", linear="decay to 0 at max_steps")
    warmup_steps: int = _f(0, "linear warm-up steps")
    micro_batch_size: int = _f(0, "completions per forward/backward; 0 = the whole batch")
    optim: Optimizer = _choice(Optimizer, "adamw", adamw_8bit="bitsandbytes")


@dataclass
class RunConfig:
    output_dir: str = _f("runs/grpo", "where metrics, checkpoints and the final model go")
    max_steps: int = _f(100, "optimizer steps")
    seed: int = _f(0, "seed for data order, sampling and init")
    logging_steps: int = _f(1, "console log every N steps (metrics.jsonl gets every step)")
    eval_steps: int = _f(0, "evaluate on the held-out split every N steps; 0 = start and end only")
    eval_limit: int = _f(0, "held-out problems per evaluation; 0 = none, -1 = all")
    save_steps: int = _f(0, "checkpoint every N steps; 0 = only the final model")
    save_total_limit: int = _f(2, "checkpoints kept")
    resume: bool | str = _f(False, "true: continue from the newest complete checkpoint in output_dir (error if "
                            "none) | auto: continue if there is one, else start fresh | false")
    overwrite: bool = _f(False, "allow an output_dir that holds another run")
    report_to: list = _f([], "extra loggers: tensorboard, wandb, mlflow, trackio")
    log_completions_steps: int = _f(0, "write sample completions every N steps; 0 = never")
    track_prompts: bool = _f(False, "per-prompt reward history")
    max_bad_steps: int = _f(3, "stop after this many non-finite updates in a row")
    progress: bool = _f(True, "show a progress bar")
    fsdp: bool = _f(False, "with several ranks (torchrun): shard weights, gradients and optimizer state "
                    "with PyTorch FSDP2 instead of replicating them (DDP)")
    iterations: int = _f(0, "Algorithm 1: I outer iterations, each: reference <- policy, M policy steps, then "
                         "continual training of the rm: reward on the iteration's samples; 0 = off")
    steps_per_iteration: int = _f(0, "Algorithm 1: M policy steps per iteration (run.max_steps = I * M)")


@dataclass
class RMConfig:
    """Learned reward models (`rm:PATH` in reward.funcs) and their continual training (Algorithm 1)."""

    batch_size: int = _f(32, "texts per reward-model forward pass")
    device: str = _f("auto", "where the reward model runs: auto (the policy's device) | cpu | cuda | cuda:N")
    precision: RMPrecision = _choice(RMPrecision, "fp32", before="reward-model compute: ")
    transform: RMTransform = _choice(RMTransform, "none", before="score squash: ", none="the raw logit, as TRL",
                                     sigmoid="a probability in (0, 1)")
    step_separator: str = _f("\n", "process RM: the text between separators is one step (e.g. a newline, "
                             "'. ' or a step tag)")
    max_length: int = _f(0, "longest reward-model input in tokens (prompt + completion); 0 = the model's "
                         "max_position_embeddings; a longer input is an error")
    continual_training: bool = _f(True, "Algorithm 1: train the RM after each iteration; false = a frozen RM "
                                  "(the comparison), the reference still reset each iteration")
    replay_share: float = _f(0.1, "Algorithm 1: share of historical samples in each continual-training mix")
    learning_rate: float = _f(1e-4, "Algorithm 1: reward-model AdamW learning rate")
    epochs: int = _f(1, "Algorithm 1: passes over each iteration's training mix")
    train_batch_size: int = _f(32, "Algorithm 1: samples per reward-model optimizer step")
    objective: RMObjective = _choice(RMObjective, "pointwise", pointwise="binary cross-entropy on verifier labels",
                                     pairwise="Bradley-Terry on right/wrong pairs of one prompt")
    step_labels: StepLabels = _choice(StepLabels, "verifier", before="process RM labels: ",
                                      verifier="the arithmetic step checker; the final step by the answer",
                                      mc="Math-Shepherd: a step is good if a rollout from it is right")
    mc_rollouts: int = _f(4, "step_labels=mc: completions sampled from each step prefix")


SECTIONS = {"model": ModelConfig, "task": TaskConfig, "rollout": RolloutConfig,
            "reward": RewardConfig, "loss": LossConfig, "optim": OptimConfig, "run": RunConfig, "rm": RMConfig}

# Presets fill defaults before the user's keys: an explicit key always wins.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"loss.loss_type": "grpo", "loss.importance_sampling_level": "token", "loss.beta": 0.04,
              "loss.epsilon": 0.2, "loss.num_iterations": 1, "loss.scale_rewards": "group"},
    "dr_grpo": {"loss.loss_type": "dr_grpo", "loss.scale_rewards": "none", "loss.beta": 0.0},
    "dapo": {"loss.loss_type": "dapo", "loss.epsilon": 0.2, "loss.epsilon_high": 0.28, "loss.beta": 0.0,
             "loss.importance_sampling_level": "token", "rollout.dynamic_sampling": True,
             "loss.mask_truncated_completions": False, "reward.overlong_buffer": 64},
    "gspo": {"loss.importance_sampling_level": "sequence", "loss.epsilon": 3e-4, "loss.epsilon_high": 4e-4,
             "loss.beta": 0.0, "loss.loss_type": "grpo"},
}

@dataclass
class GRPOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    preset: str | None = None

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def batch_size(self) -> int:
        """Completions per generation batch: B * G."""
        return self.rollout.prompts_per_step * self.rollout.num_generations

    @property
    def epsilon_high(self) -> float:
        return self.loss.epsilon if self.loss.epsilon_high is None else self.loss.epsilon_high


def _all_keys() -> dict[str, str]:
    """Every dotted key 'section.field', and each field's bare name when it is unambiguous."""
    dotted = {f"{s}.{f.name}": f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    bare: dict[str, list[str]] = {}
    for key in dotted:
        bare.setdefault(key.split(".", 1)[1], []).append(key)
    return {**dotted, **{k: v[0] for k, v in bare.items() if len(v) == 1}}


def _resolve_key(key: str) -> str:
    if key == "preset":
        return key
    keys = _all_keys()
    if key in keys:
        return keys[key]
    if key in SECTIONS:
        raise ConfigError(f"'{key}' is a section: set its fields as {key}.<field>=value")
    raise ConfigError(f"unknown config key '{key}'{suggest(key, list(keys) + ['preset'])}")


def _field_type(section: str, name: str) -> Any:
    hints = typing.get_type_hints(SECTIONS[section])
    return hints[name]


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML/CLI value to the field's declared type, or raise a one-line ConfigError."""
    section, name = key.split(".", 1)
    tp = _field_type(section, name)
    if typing.get_origin(tp) is Literal:              # a declared choice (grpokit.choices): one of its values
        options = [str(a) for a in typing.get_args(tp)]
        if str(value) in options:
            return str(value)
        raise ConfigError(f"{key} must be one of {', '.join(options)}, got {value!r}{suggest(str(value), options)}")
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    base = typing.get_origin(base) or base
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and base is not str):
        if optional:
            return None
        if base is list:  # `run.report_to: none` (TRL's spelling) = the empty list
            return []
        raise ConfigError(f"{key} cannot be empty: give a {getattr(base, '__name__', base)}")
    try:
        if base is bool:
            if isinstance(value, str):
                low = value.lower()
                if low in ("true", "1", "yes", "on"):
                    return True
                if low in ("false", "0", "no", "off"):
                    return False
                if str in args:  # a `bool | str` field (run.resume): validate checks the word
                    return low
                raise ValueError
            if isinstance(value, (bool, int)) and value in (0, 1):
                return bool(value)
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if base is list:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v] if value.lower() != "none" else []
            if not isinstance(value, list):
                raise ValueError
            return value
        if base is dict:
            if isinstance(value, str):
                import yaml

                value = yaml.safe_load(value)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except (TypeError, ValueError):
        pass
    else:
        return value
    want = getattr(base, "__name__", str(base))
    raise ConfigError(f"{key} must be a {want}, got {value!r}: change it to a {want}")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'loss': {'beta': 0}} -> {'loss.beta': 0}; dict-valued fields (reward.funcs) stay whole."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix and key in SECTIONS:
            out.update(_flatten(value, prefix=f"{key}."))
        else:
            out[full] = value
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """CLI `key=value` strings to a flat dict; values are parsed as YAML scalars."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value: write it as e.g. loss.beta=0.0")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def build_config(values: dict[str, Any] | None = None) -> GRPOConfig:
    """A validated config from a (nested or dotted) dict: preset first, then explicit keys."""
    flat = _flatten(dict(values or {}))
    preset = flat.pop("preset", None)
    resolved: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset '{preset}'{suggest(str(preset), PRESETS)}: "
                              f"choose one of {', '.join(PRESETS)}")
        resolved.update(PRESETS[preset])
    for key, value in flat.items():
        resolved[_resolve_key(key)] = value
    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key, value in resolved.items():
        section, name = key.split(".", 1)
        sections[section][name] = _coerce(key, value)
    return GRPOConfig(**{s: SECTIONS[s](**kw) for s, kw in sections.items()}, preset=preset)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> GRPOConfig:
    """Load YAML (optional), apply `key=value` overrides, validate. Raises ConfigError."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file '{p}' is a folder: give the path of a YAML file in it")
        if not p.is_file():
            raise ConfigError(f"config file '{p}' does not exist: give the path of a YAML file")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file '{p}' is not UTF-8 text (byte {e.start}): "
                              "save it as UTF-8") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file '{p}'{where} is not valid YAML: fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file '{p}' must hold a mapping of sections, not {type(loaded).__name__}")
        values = _flatten(loaded or {})
    values.update(_flatten(parse_overrides(overrides or [])) if overrides else {})
    return build_config(values)


def explicit_preset_conflicts(cfg: GRPOConfig) -> dict[str, tuple[Any, Any]]:
    """Keys where the resolved value differs from what the preset would set: {key: (preset, now)}."""
    if cfg.preset is None:
        return {}
    out = {}
    for key, want in PRESETS[cfg.preset].items():
        section, name = key.split(".", 1)
        have = getattr(getattr(cfg, section), name)
        if have != want:
            out[key] = (want, have)
    return out


def config_reference() -> str:
    """Markdown table of every key, its default and meaning (used to write the README)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for s, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            meaning = f.metadata["help"].replace("|", "\\|")  # a bare | would split the table cell
            if isinstance(default, str) and any(c in default for c in "\n\t\r"):
                default = repr(default)  # a newline (rm.step_separator) would end the table row
            rows.append(f"| `{s}.{f.name}` | `{default}` | {meaning} |")
    return "\n".join(rows)

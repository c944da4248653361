"""Every config choice, declared once as a `Literal` type.

The config's field types, its help text and its validation derive from these (grpokit.config.schema,
grpokit.config.validation), and so do the switches that dispatch on them (e.g. `loss.LOSS_TYPES`). This
module imports nothing else from grpokit and no torch, so the pure-math modules can use it.
"""

from __future__ import annotations

from typing import Literal

Dtype = Literal["float32", "bfloat16", "float16"]              # model.dtype: the stored weights
Precision = Literal["fp32", "bf16", "auto"]                    # model.precision: compute precision
QuantType = Literal["nf4", "fp4"]                              # model.bnb_4bit_quant_type
TaskName = Literal["arithmetic", "gsm8k", "math500", "jsonl", "hf", "environment",  # task.name
                   "functions", "humaneval", "mbpp", "code"]
SandboxMode = Literal["bwrap", "process"]                      # reward.sandbox (grpokit.sandbox)
AnswerFormat = Literal["boxed", "r1"]                          # task.format
TruncatePrompt = Literal["left", "error"]                      # rollout.truncate_prompt
Backend = Literal["auto", "fast", "generate", "vllm"]          # rollout.backend
VLLMMode = Literal["colocate", "server"]                       # rollout.vllm_mode
ToolFormat = Literal["auto", "chat", "plain"]                  # rollout.tool_format (grpokit.agents.formats)
RewardErrors = Literal["raise", "skip"]                        # reward.reward_errors
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]  # loss.loss_type
ImportanceSamplingLevel = Literal["token", "sequence"]         # loss.importance_sampling_level
ScaleRewards = Literal["group", "batch", "none"]               # loss.scale_rewards (grpokit.core.advantages)
TISLevel = Literal["token", "sequence", "none"]                # loss.tis_level
TISMode = Literal["truncate", "mask"]                          # loss.tis_mode
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]  # loss.multi_objective_aggregation
Algorithm = Literal["grpo", "ppo"]                             # loss.algorithm (ppo: grpokit.train.ppo)
LRScheduler = Literal["constant", "linear"]                    # optim.lr_scheduler_type
Optimizer = Literal["adamw", "adamw_8bit"]                     # optim.optim
RMPrecision = Literal["fp32", "bf16"]                          # rm.precision
RMTransform = Literal["none", "sigmoid"]                       # rm.transform
RMObjective = Literal["pointwise", "pairwise"]                 # rm.objective
StepLabels = Literal["verifier", "mc"]                         # rm.step_labels
LogLevel = Literal["passive", "debug", "info", "warning", "error", "critical"]  # run.log_level
DDPBackend = Literal["auto", "nccl", "gloo", "mpi"]             # run.ddp_backend (torch.distributed)

"""A QLoRA GRPO run's GPU memory, computed from the parts `grpokit bench --memory --config` measured.

Computed, not measured: no GPU ran these numbers. Each part is a count from the architecture times a
cost per unit taken from a measured CPU run (a `recipebench` qlora row) or from the storage grpokit uses:

    quantized linears   linear weights x q           q: bytes per 4-bit weight with its block scales, measured
    other weights       embeddings, norms, biases, an untied head, x 4 bytes (float32, frozen)
    adapters            LoRA parameters x 16 bytes (float32 weight, its gradient, two AdamW moments)
    lm-head logits      3 live [1024, V] float32 tensors (the chunk, its softmax, its gradient)
    activations         a x tokens x hidden x layers, a measured: the CPU run's step peak less the process
                        baseline, the weights, gradients, optimizer state and logits, over its micro-batch
                        tokens x hidden x layers. With gradient checkpointing: each layer keeps its float32
                        input (4 bytes x tokens x hidden) and one layer runs at a time (a x tokens x hidden)
    KV cache            2 x layers x kv_heads x head_dim x row width x rows x 2 bytes (bf16), while sampling
    CUDA context        500 MiB, assumed

The peak is the larger of the sampling phase (weights, adapters, KV cache) and the update phase (weights,
adapters, logits, activations), plus the context. The CPU's activations include allocator slack and
float32 temporaries a GPU kernel may not make, so the estimate leans high.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
CUDA_CONTEXT_MIB = 500.0
LOGIT_TENSORS = 3     # the [1024, V] chunk's logits, softmax and gradient, float32
CHUNK_ROWS = 1024
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """A decoder's sizes (its config.json on the Hub)."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each of a layer's seven projections."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def linear_params(self) -> int:
        """The weights bitsandbytes quantizes: every projection of every layer (not the head)."""
        return self.layers * sum(a * b for a, b in self.projection_shapes().values())

    def other_params(self) -> int:
        """Embeddings, norms (two a layer and the final one), biases, an untied head: kept in float32."""
        bias = self.hidden + 2 * self.kv_heads * self.head_dim if self.qkv_bias else 0
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + head + self.layers * (2 * self.hidden + bias) + self.hidden

    def lora_params(self, r: int, targets: tuple[str, ...] = PROJECTIONS) -> int:
        return self.layers * sum(r * (a + b) for name, (a, b) in self.projection_shapes().items()
                                 if name in targets)


ARCHS = {a.name: a for a in (
    Arch("SmolLM2-135M-Instruct", 49152, 576, 30, 9, 3, 1536, tied=True),
    Arch("Qwen2.5-0.5B-Instruct", 151936, 896, 24, 14, 2, 4864, tied=True, qkv_bias=True),
    Arch("Qwen2.5-1.5B-Instruct", 151936, 1536, 28, 12, 2, 8960, tied=True, qkv_bias=True),
    Arch("Qwen2.5-3B-Instruct", 151936, 2048, 36, 16, 2, 11008, tied=True, qkv_bias=True),
    Arch("Qwen2.5-7B-Instruct", 152064, 3584, 28, 28, 4, 18944, tied=False, qkv_bias=True),
)}


@dataclass(frozen=True)
class Measured:
    """The unit costs a CPU qlora run gives (`from_row`)."""

    bytes_per_quantized_weight: float
    activation_bytes: float     # a: per token, per unit of hidden, per layer

    @classmethod
    def from_row(cls, row: dict, arch: Arch, micro_batch: int) -> Measured:
        """From a `grpokit bench --memory --config` qlora row of `arch`, trained `micro_batch` rows a pass."""
        q = row["quantized_mib"] * MIB / row["quantized_params"]
        logits = LOGIT_TENSORS * min(CHUNK_ROWS, micro_batch * row["sequence_width"]) * arch.vocab * 4
        held_mib = row["baseline_mib"] + row["weights_mib"] + row["optimizer_state_mib"]
        rest = (row["step_peak_mib"] - held_mib) * MIB - 4 * row["trainable_params"] - logits
        tokens = micro_batch * row["sequence_width"]
        return cls(q, rest / (tokens * arch.hidden * arch.layers))


def estimate_mib(arch: Arch, measured: Measured, *, r: int, micro_batch: int, width: int, rows: int,
                 checkpointing: bool) -> dict[str, float]:
    """Each part of the module docstring for one run, in MiB, and the peak."""
    tokens = micro_batch * width
    per_layer = measured.activation_bytes * tokens * arch.hidden      # one layer's saved activations
    kept_inputs = 4.0 * tokens * arch.hidden * arch.layers              # checkpointing: each layer's input
    parts = {
        "quantized_linears": arch.linear_params() * measured.bytes_per_quantized_weight,
        "other_weights": arch.other_params() * 4.0,
        "adapters": arch.lora_params(r) * 16.0,
        "logits": LOGIT_TENSORS * min(CHUNK_ROWS, tokens) * arch.vocab * 4.0,
        "activations": per_layer + kept_inputs if checkpointing else per_layer * arch.layers,
        "kv_cache": 2.0 * arch.layers * arch.kv_heads * arch.head_dim * width * rows * 2,
    }
    out = {k: v / MIB for k, v in parts.items()}
    held = out["quantized_linears"] + out["other_weights"] + out["adapters"]
    out["sampling_peak"] = held + out["kv_cache"]
    out["update_peak"] = held + out["logits"] + out["activations"]
    out["peak"] = max(out["sampling_peak"], out["update_peak"]) + CUDA_CONTEXT_MIB
    return out

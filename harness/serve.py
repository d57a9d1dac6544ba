"""``harness serve``: a rollout engine behind HTTP (FastAPI on uvicorn), for ``rollout.server.url``.

The server loads the run's model (same overrides as the run: ``model.*``, ``task``, ``rollout=hf|vllm``)
into the rollout backend the config names and answers the calls of harness/runtime/rollout/remote.py. One
generation or weight load runs at a time (a lock: backends are not re-entrant). A restarted
server starts from the model's own weights; the run notices (409) and pushes its current ones
before it generates again. Bind to 127.0.0.1 unless the trainer runs on another host: there is
no authentication.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch
from fastapi import Request  # module level: FastAPI resolves the endpoint's annotations by name
from rich.console import Console

log = logging.getLogger(__name__)


def make_app(backend: Any, info: dict, reload_base) -> Any:
    """The FastAPI app serving ``backend``; ``reload_base()`` returns the model's starting state dict."""
    from fastapi import FastAPI, HTTPException, Response
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse
    from safetensors.torch import load as st_load
    from safetensors.torch import load_file

    from harness.runtime.rollout.remote import BASE_WEIGHTS, generation_to_bytes

    app = FastAPI(title="harness rollout server")
    lock = threading.Lock()
    state = {"weights": BASE_WEIGHTS, "generations": 0}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "weights": state["weights"], "generations": state["generations"], **info}

    @app.get("/info")
    def get_info() -> dict:
        return {**info, "pad_id": int(backend.pad_id), "eos_ids": [int(e) for e in backend.eos_ids],
                "weights": state["weights"]}  # fmt: skip

    @app.post("/generate")
    def generate(body: dict) -> Response:
        with lock:
            if body.get("weights", state["weights"]) != state["weights"]:
                return JSONResponse({"weights": state["weights"]}, status_code=409)
            if hasattr(backend, "return_logp"):  # hf: the sampled tokens' log-probs only when the run wants them
                backend.return_logp = bool(body.get("logp", False))
            try:
                gen = backend.generate(body["prompts"], int(body["n"]), int(body["max_tokens"]),
                                       float(body["temperature"]), float(body.get("top_p", 1.0)), seeds=body.get("seeds"))  # fmt: skip
            except KeyError as exc:
                raise HTTPException(422, f"missing field {exc.args[0]!r}") from None
            state["generations"] += 1
        return Response(generation_to_bytes(gen), media_type="application/octet-stream")

    @app.post("/weights")
    async def weights(request: Request, id: str = "") -> dict:
        json_body = request.headers.get("content-type", "").startswith("application/json")
        body = await (request.json() if json_body else request.body())  # read on the event loop, load off it

        def load() -> dict:  # blocking work (decode, copy, waiting for a generation) in a worker thread
            if not json_body:
                tensors, new_id = st_load(body), id
            elif body.get("reset"):
                tensors, new_id = reload_base(), BASE_WEIGHTS
            elif "path" in body:
                tensors, new_id = load_file(body["path"]), id
            else:
                raise HTTPException(422, "JSON body needs 'path' (a safetensors file) or 'reset': true")
            if not new_id:
                raise HTTPException(422, "POST /weights?id=ID: the id names the weights for later generate calls")
            with lock:
                backend.load_weights(tensors)
                state["weights"] = new_id
            return {"weights": new_id, "tensors": len(tensors)}

        return await run_in_threadpool(load)

    return app


def serve(cfg: Any, host: str, port: int, console: Console | None = None) -> None:
    """Load the model ``cfg`` names into its rollout backend and serve it until interrupted."""
    import uvicorn

    import rewards
    from harness.config import runtime_settings, validate
    from harness.models import load_tokenizer, resolve_model
    from harness.runtime.loading import load_causal_lm
    from harness.runtime.workers.worker import build_rollout, resolve_device
    from harness.tasks import load_task

    console = console or Console()
    if cfg.rollout.server.url:
        raise SystemExit(f"error: harness serve runs the engine itself; drop rollout.server.url={cfg.rollout.server.url}")
    validate(cfg, serving=True)
    if cfg.runtime.threads > 0:
        torch.set_num_threads(cfg.runtime.threads)
    task, checker = load_task(cfg.task), rewards.get(cfg.task.checker)
    model_path, _ = resolve_model(cfg.model, task, checker, cfg.rollout.max_response_tokens, console, cfg.env)
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    device = resolve_device(cfg.runtime.device)
    torch.manual_seed(int(cfg.seed))
    backend = build_rollout(runtime_settings(cfg).worker(return_logp=False), model_path, tokenizer, device)

    def reload_base() -> dict:
        return load_causal_lm(model_path, "float32", cfg.model.trust_remote_code).state_dict()

    info = {"model": str(model_path), "backend": cfg.rollout.backend, "vocab": len(tokenizer)}
    app = make_app(backend, info, reload_base)
    console.print(f"rollout server: {cfg.rollout.backend} engine on {model_path}, http://{host}:{port} "
                  f"(runs use it with rollout.server.url=http://{host}:{port})")  # fmt: skip
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()

"""``harness serve``: a rollout engine behind HTTP (FastAPI on uvicorn), for ``rollout.server.url``.

The server loads the run's model (same overrides as the run: ``model.*``, ``task``, ``rollout=hf|vllm``)
into the rollout backend the config names and answers the calls of harness/runtime/rollout/remote.py. One
generation or weight load runs at a time (a lock: backends are not re-entrant). A restarted
server starts from the model's own weights; the run notices (409) and pushes its current ones
before it generates again.

What holds it up off localhost (docs/async.md, "A rollout server on another host"):

* **A shared token.** ``HARNESS_SERVE_TOKEN`` or ``--token-file``; every call needs
  ``Authorization: Bearer <token>`` (compared in constant time; 401 otherwise). On a non-loopback
  address the server refuses to start without one unless ``--insecure``. TLS: a reverse proxy in
  front; the server speaks plain HTTP.
* **Validated requests** (pydantic models): types and ranges, token ids below the vocabulary, and
  caps set at start (``ServeLimits``: samples, tokens, prompts per call, prompt tokens, body bytes:
  413 past it). Weights by path only from ``--weights-dir``; pushed tensors must match the model's
  names and shapes before anything is loaded, so a bad push leaves the served weights unchanged.
* **No tracebacks for client errors:** a 4xx with a one-line reason. A server error is logged once
  with an id the 500 body carries.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import torch

# module level: FastAPI resolves the endpoints' annotations by name
from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.console import Console

from harness.config import Config
from harness.runtime.rollout.remote import TOKEN_ENV  # the shared token's variable, on both ends

log = logging.getLogger(__name__)

MiB = 1 << 20
MIN_TEMPERATURE = 1e-3  # the smallest sampling temperature served (0: greedy)
PUSHED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask of the server (``harness serve --max-*``); past a cap: 422, or 413 for a body."""

    n: int = 64  # samples per prompt
    max_tokens: int = 4096  # new tokens per sample
    prompts: int = 1024  # prompts per /generate call
    prompt_tokens: int = 8192  # tokens per prompt
    sequences: int = 8192  # prompts x n per call: the work (and memory) of one call
    weights_mb: float = 0.0  # a /weights body; 0 = the model's float32 size + 10% + 1 MiB

    def generate_body_bytes(self) -> int:
        return self.prompts * self.prompt_tokens * 8 + MiB  # JSON token ids: up to 7 digits and a comma each


@dataclass(frozen=True)
class WeightSpec:
    """The served model's tensors: what a weight push must match before anything is loaded."""

    shapes: dict[str, tuple[int, ...]]  # every state-dict name (tied aliases and buffers too)
    required: frozenset[str]  # the distinct parameters: a push must hold each one

    @classmethod
    def of(cls, model: torch.nn.Module) -> WeightSpec:
        return cls({k: tuple(v.shape) for k, v in model.state_dict().items()},
                   frozenset(k for k, _ in model.named_parameters()))  # fmt: skip

    def float32_bytes(self) -> int:
        return sum(4 * int(torch.Size(s).numel()) for s in self.shapes.values())

    def check(self, tensors: dict[str, torch.Tensor]) -> None:
        """Raise a 422 naming the first mismatch: an unknown name, a missing parameter, another shape, another dtype."""
        unknown = sorted(set(tensors) - set(self.shapes))
        missing = sorted(self.required - set(tensors))
        if unknown or missing:
            raise HTTPException(422, f"weights do not fit the served model: unknown {unknown[:3]}, missing {missing[:3]}")
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != self.shapes[name]:
                raise HTTPException(422, f"weights: {name} has shape {list(tensor.shape)}, the served model's is "
                                         f"{list(self.shapes[name])}")  # fmt: skip
            if tensor.dtype not in PUSHED_DTYPES:  # the engine casts to its own dtype; these cast without surprise
                raise HTTPException(422, f"weights: {name} is {tensor.dtype}; pushes are float32, bfloat16 or float16")


@dataclass(frozen=True)
class ServeOptions:
    """How ``harness serve`` is exposed: the token, the weights directory, the caps."""

    token: str = ""  # '' = no authentication (loopback, or --insecure)
    weights_dir: Path | None = None  # POST /weights {"path": ...} reads files under it only
    limits: ServeLimits = field(default_factory=ServeLimits)


# ---------------------------------------------------------------------------------------------- requests
class GenerateRequest(BaseModel):
    """POST /generate: prompts as texts or token ids, and how to sample them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    prompts: list[Annotated[str, Field(min_length=1)]] | list[Annotated[list[int], Field(min_length=1)]] = Field(min_length=1)
    n: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    temperature: float = Field(ge=0.0, le=100.0)  # 0 = greedy; else at least MIN_TEMPERATURE
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seeds: list[int] | None = None  # one per prompt
    weights: str | None = Field(default=None, max_length=200)  # the weights id the client expects
    logp: bool = False

    @model_validator(mode="after")
    def _seeds_per_prompt(self) -> GenerateRequest:
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / T overflow to inf: no distribution left to sample
            raise ValueError(f"temperature: 0 (greedy) or at least {MIN_TEMPERATURE}")
        if self.seeds is not None:
            if len(self.seeds) != len(self.prompts):
                raise ValueError(f"seeds: one per prompt ({len(self.prompts)}), got {len(self.seeds)}")
            if any(not 0 <= s < 2**62 for s in self.seeds):
                raise ValueError("seeds: integers in [0, 2**62)")
        return self


class WeightsRequest(BaseModel):
    """POST /weights with a JSON body: a file under the server's weights dir, or back to the model's own."""

    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    reset: Literal[True] | None = None

    @model_validator(mode="after")
    def _one(self) -> WeightsRequest:
        if (self.path is None) == (self.reset is None):
            raise ValueError("give 'path' (a safetensors file in the server's --weights-dir) or 'reset': true")
        return self


def _parse(model: type[BaseModel], body: bytes) -> Any:
    """The request model of ``body``, or a 422 with the first problem in one line."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        # loc names a union's member too ("list[constrained-str]"): keep the field names and indices
        where = ".".join(str(p) for p in first["loc"] if isinstance(p, int) or str(p).isidentifier()) or "body"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise HTTPException(422, f"{where}: {first['msg']}{more}") from None


async def _read_body(request: Request, cap_bytes: int) -> bytes:
    """The request body, or a 413 as soon as it passes ``cap_bytes`` (declared or streamed)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap_bytes:
        raise HTTPException(413, f"body of {int(declared)} bytes; this server takes at most {cap_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap_bytes:
            raise HTTPException(413, f"body over {cap_bytes} bytes, the most this server takes")
        chunks.append(chunk)
    return b"".join(chunks)


def _check_generate(req: GenerateRequest, limits: ServeLimits, vocab: int, context: int, count_tokens) -> None:
    """The caps set at start, token ids inside the vocabulary, prompt and response inside the model's
    context of ``context`` positions (0: unknown). A 422 naming the field."""
    caps = (("n", req.n, limits.n), ("max_tokens", req.max_tokens, limits.max_tokens),
            ("prompts", len(req.prompts), limits.prompts), ("prompts x n", len(req.prompts) * req.n, limits.sequences))  # fmt: skip
    for name, value, cap in caps:
        if value > cap:
            raise HTTPException(422, f"{name}: {value} is over this server's cap of {cap} (harness serve --max-*)")
    for i, prompt in enumerate(req.prompts):
        length = count_tokens(prompt) if isinstance(prompt, str) else len(prompt)
        if length > limits.prompt_tokens:
            raise HTTPException(422, f"prompts.{i}: {length} tokens, over this server's cap of {limits.prompt_tokens}")
        if not isinstance(prompt, str) and prompt and not 0 <= min(prompt) <= max(prompt) < vocab:
            raise HTTPException(422, f"prompts.{i}: token ids must lie in [0, {vocab}) (the served vocabulary)")
        if context and length + req.max_tokens > context:
            raise HTTPException(422, f"prompts.{i}: {length} prompt tokens + max_tokens {req.max_tokens} exceed the "
                                     f"model's context of {context} positions")  # fmt: skip


def _weights_file(weights_dir: Path | None, path: str) -> Path:
    """``path`` (relative to the weights dir, or absolute inside it) resolved, or a 403 / 404."""
    if weights_dir is None:
        raise HTTPException(403, "this server loads no weights by path; start it with --weights-dir DIR "
                                 "(storage the run also sees) or push the weights in the body")  # fmt: skip
    root = weights_dir.resolve()
    target = (root / path).resolve()  # an absolute path replaces root; '..' and links are resolved
    if not target.is_relative_to(root) or target.suffix != ".safetensors":
        raise HTTPException(403, f"path {path!r}: only .safetensors files under the server's --weights-dir")
    if not target.is_file():
        raise HTTPException(404, f"path {path!r}: no such file under the server's --weights-dir")
    return target


# --------------------------------------------------------------------------------------------------- app
class ErrorIds:
    """ASGI middleware: an unhandled error becomes a 500 whose body carries an id, logged once with it."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("server error %s on %s %s", error_id, scope.get("method"), scope.get("path"))
            if started:  # nothing can be said any more: the connection is closed by the server
                return
            from starlette.responses import JSONResponse

            await JSONResponse({"detail": f"server error {error_id} (in the server's log)", "id": error_id},
                               status_code=500)(scope, receive, send)  # fmt: skip


def make_app(backend: Any, info: dict, reload_base, spec: WeightSpec, options: ServeOptions | None = None,
             count_tokens=None) -> Any:  # fmt: skip
    """The FastAPI app serving ``backend``; ``reload_base()`` returns the model's starting state dict,
    ``count_tokens(text)`` a text prompt's length in tokens."""
    from fastapi import FastAPI, Response
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse
    from safetensors.torch import load as st_load
    from safetensors.torch import load_file

    from harness.runtime.rollout.remote import BASE_WEIGHTS, generation_to_bytes

    options = options or ServeOptions()
    limits, vocab, context = options.limits, int(info["vocab"]), int(info.get("context") or 0)
    weights_cap = int(limits.weights_mb * MiB) if limits.weights_mb > 0 else int(1.1 * spec.float32_bytes()) + MiB
    count_tokens = count_tokens or (lambda text: len(text))
    app = FastAPI(title="harness rollout server", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()
    state = {"weights": BASE_WEIGHTS, "generations": 0}
    expected = f"Bearer {options.token}".encode()

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if options.token:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):  # constant time: no timing oracle on the token
                host = request.client.host if request.client else "?"
                log.warning("401 %s %r from %s: %s token", request.method, request.url.path, host,
                            "wrong" if given else "no")  # fmt: skip
                return JSONResponse({"detail": "missing or wrong token (Authorization: Bearer ...; "
                                               f"{TOKEN_ENV} or rollout.server.token_file on the run)"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return await call_next(request)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "weights": state["weights"], "generations": state["generations"], **info}

    @app.get("/info")
    def get_info() -> dict:
        return {**info, "pad_id": int(backend.pad_id), "eos_ids": [int(e) for e in backend.eos_ids],
                "weights": state["weights"], "limits": vars(limits)}  # fmt: skip

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        req = _parse(GenerateRequest, await _read_body(request, limits.generate_body_bytes()))

        def run() -> Response:
            with lock:  # under the lock: counting a text prompt's tokens uses the engine's tokenizer
                _check_generate(req, limits, vocab, context, count_tokens)
                if req.weights is not None and req.weights != state["weights"]:
                    return JSONResponse({"weights": state["weights"]}, status_code=409)
                if hasattr(backend, "return_logp"):  # hf: the sampled tokens' log-probs only when the run wants them
                    backend.return_logp = req.logp
                gen = backend.generate(req.prompts, req.n, req.max_tokens, req.temperature, req.top_p, seeds=req.seeds)
                state["generations"] += 1
            return Response(generation_to_bytes(gen), media_type="application/octet-stream")

        return await run_in_threadpool(run)

    @app.post("/weights")
    async def weights(request: Request, id: str = "") -> dict:
        json_body = request.headers.get("content-type", "").startswith("application/json")
        body = await _read_body(request, 64 * 1024 if json_body else weights_cap)  # on the event loop; load off it
        if len(id) > 200:
            raise HTTPException(422, "id: at most 200 characters")

        def load() -> dict:  # blocking work (decode, check, copy, waiting for a generation) in a worker thread
            req = _parse(WeightsRequest, body) if json_body else None
            if req is not None and req.reset:
                tensors, new_id = reload_base(), BASE_WEIGHTS
            else:
                source = None if req is None else _weights_file(options.weights_dir, req.path)  # 403 / 404 first
                new_id = id
                if not new_id:
                    raise HTTPException(422, "POST /weights?id=ID: the id names the weights for later generate calls")
                try:  # untrusted bytes: any decoding error is the sender's
                    tensors = st_load(body) if source is None else load_file(str(source))
                except Exception as exc:  # not safetensors, truncated, a dtype torch lacks, ...
                    first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
                    raise HTTPException(422, f"weights: not a readable safetensors file ({first})") from None
            spec.check(tensors)  # before anything is loaded: a bad push leaves the served weights as they are
            with lock:
                # A load that fails part-way leaves mixed weights: no id names them, so every generate
                # call gets 409 and the run pushes its weights again.
                state["weights"] = f"(loading {new_id})"
                backend.load_weights(tensors)
                state["weights"] = new_id
            return {"weights": new_id, "tensors": len(tensors)}

        return await run_in_threadpool(load)

    app.add_middleware(ErrorIds)  # outermost of the app's own: wraps the token check and every endpoint
    return app


# ------------------------------------------------------------------------------------------------ serve
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_exposure(host: str, token: str, insecure: bool) -> None:
    """Refuse an unauthenticated server on an address other hosts can reach."""
    if not token and not insecure and not is_loopback(host):
        raise SystemExit(f"error: harness serve --host {host} without a token: anyone who reaches the port could push "
                         f"weights; set {TOKEN_ENV} or --token-file (the run: the same variable or "
                         f"rollout.server.token_file), or pass --insecure on a network you trust")  # fmt: skip


def build_server(cfg: Config, options: ServeOptions, console: Console | None = None) -> tuple[Any, Any, str]:
    """The app, its backend (close it when done) and the model path, for the model ``cfg`` names."""
    import rewards
    from harness.config import runtime_settings, validate
    from harness.data.tasks import load_task
    from harness.models import load_tokenizer, resolve_model
    from harness.runtime.loading import load_causal_lm
    from harness.runtime.rollout import get_backend
    from harness.runtime.workers.worker import build_rollout, resolve_device

    if cfg.rollout.server.url:
        raise SystemExit(f"error: harness serve runs the engine itself; drop rollout.server.url={cfg.rollout.server.url}")
    validate(cfg, serving=True)
    if cfg.runtime.threads > 0:
        torch.set_num_threads(cfg.runtime.threads)
    task, checker = load_task(cfg.task), rewards.get(cfg.task.checker)
    model_path, _ = resolve_model(cfg.model, task, checker, cfg.rollout.max_response_tokens, console, cfg.env)
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    torch.manual_seed(int(cfg.seed))
    settings = runtime_settings(cfg)
    backend = build_rollout(settings.worker(return_logp=False), model_path, tokenizer,
                            resolve_device(cfg.runtime.device))  # fmt: skip

    def reload_base() -> dict:
        return load_causal_lm(model_path, "float32", cfg.model.trust_remote_code).state_dict()

    meta = _meta_model(model_path, cfg.model.trust_remote_code)
    context = int(getattr(meta.config, "max_position_embeddings", 0) or 0)
    spec = get_backend(settings.rollout.backend)
    window = spec.window(settings.rollout) if spec.window is not None else 0
    if window > 0:  # the engine's own window, set shorter than the model's
        context = min(context or window, window)
    info = {"model": str(model_path), "backend": cfg.rollout.backend, "vocab": len(tokenizer), "context": context}
    app = make_app(backend, info, reload_base, WeightSpec.of(meta), options,
                   count_tokens=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))  # fmt: skip
    return app, backend, str(model_path)


def _meta_model(model_path: str, trust_remote_code: bool) -> torch.nn.Module:
    """The model's module tree with no storage (names and shapes only)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def serve(cfg: Config, host: str, port: int, options: ServeOptions, console: Console | None = None) -> None:
    """Load the model ``cfg`` names into its rollout backend and serve it until interrupted."""
    import uvicorn

    console = console or Console()
    app, backend, model_path = build_server(cfg, options, console)
    access = "token required" if options.token else "NO authentication"
    console.print(f"rollout server: {cfg.rollout.backend} engine on {model_path}, http://{host}:{port} ({access}; "
                  f"runs use it with rollout.server.url=http://{host}:{port})")  # fmt: skip
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()

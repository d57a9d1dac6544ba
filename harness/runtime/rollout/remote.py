"""The rollout engine as a service: the wire format and the trainer's client (``rollout.server.url``).

``harness serve`` (harness/commands/serve.py) runs a rollout backend (hf or vllm) behind HTTP; a run with
``rollout.server.url=http://host:port`` uses ``RemoteRollout`` in place of an in-process engine. Both
ends speak four calls:

* ``GET /health``: ``{"status": "ok", "weights": id, ...}``.
* ``GET /info``: pad and EOS token ids, vocabulary size, the model the server loaded.
* ``POST /generate`` (JSON: prompts as text or token ids, n, max_tokens, temperature, top_p,
  seeds, ``weights``: the id of the weights the client expects) -> the ``Generation`` tensors as a
  safetensors file; 409 when the server holds other weights (it restarted: the client pushes its
  weights again and repeats the request, which seeded sampling makes identical).
* ``POST /weights?id=ID``: a safetensors file of the full state dict in the body, or
  ``{"path": name}`` (JSON) for a file in a directory both ends see (large models): the run's
  ``rollout.server.weights_dir``, the server's ``--weights-dir``.

With a shared token (``$HARNESS_SERVE_TOKEN`` or ``rollout.server.token_file``), every call carries
``Authorization: Bearer <token>``; the server answers 401 without it.

The client waits out a lost server (connection refused or reset) for ``rollout.server.retry_s``,
retrying with backoff, then fails naming the URL; a server that never answered fails within
``rollout.server.connect_s``.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from harness.core.errors import ConfigError, HarnessError
from harness.runtime.rollout.base import (
    REMOTE,
    BackendMemory,
    Generation,
    MemoryFacts,
    RolloutContext,
    register_backend,
)
from harness.runtime.settings import DriverSettings

log = logging.getLogger(__name__)

GENERATION_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "truncated", "group_ids",
                     "rollout_logp")  # fmt: skip
BASE_WEIGHTS = "base"  # the id of the weights a server loaded at start (the model it was started with)


TOKEN_ENV = "HARNESS_SERVE_TOKEN"  # the shared token of a run and its rollout server


class RolloutServiceError(HarnessError):
    """The rollout server is unreachable, or answered with an error."""


def shared_token(token_file: str = "") -> str:
    """The token a run and its server share: ``token_file``'s content, else ``$HARNESS_SERVE_TOKEN``, else ''."""
    import os
    from pathlib import Path

    if not token_file:
        return os.environ.get(TOKEN_ENV, "").strip()
    try:
        token = Path(token_file).expanduser().read_text().strip()
    except OSError as exc:
        raise ConfigError(f"token file {token_file}: cannot read it ({exc.strerror})") from None
    if not token:
        raise ConfigError(f"token file {token_file} is empty")
    return token


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def generation_to_bytes(gen: Generation) -> bytes:
    tensors = {f: getattr(gen, f).contiguous() for f in GENERATION_FIELDS if getattr(gen, f) is not None}
    return st_save(tensors)


def generation_from_bytes(data: bytes) -> Generation:
    tensors = st_load(data)
    return Generation(**{f: tensors.get(f) for f in GENERATION_FIELDS})


def state_to_bytes(state: dict[str, torch.Tensor]) -> bytes:
    # safetensors refuses tensors sharing storage (tied embeddings): each is sent as its own copy
    return st_save({k: v.detach().cpu().contiguous().clone() for k, v in state.items()})


def check_server(url: str, connect_s: float, token: str = "") -> dict:
    """The server's /health, or a RolloutServiceError naming ``url`` within about ``connect_s`` seconds
    (before a run builds its models)."""
    import httpx

    deadline = time.monotonic() + connect_s
    while True:
        try:
            response = httpx.get(url.rstrip("/") + "/health", timeout=min(connect_s, 5.0), headers=auth_headers(token))
            if response.status_code == 401:
                raise RolloutServiceError(_refused(url))
            response.raise_for_status()
            return response.json()
        except httpx.HTTPError as exc:
            if time.monotonic() >= deadline:
                raise RolloutServiceError(f"rollout.server.url={url}: no rollout server answers /health ({type(exc).__name__}: "
                                          f"{exc}); start one with `harness serve` (same model overrides) or fix "
                                          f"rollout.server.url") from None  # fmt: skip
            time.sleep(0.5)


def _refused(url: str) -> str:
    return (f"rollout.server.url={url} refused this run's token (HTTP 401): give the server's token with "
            f"${TOKEN_ENV} or rollout.server.token_file")


class RemoteRollout:
    """A rollout backend whose engine lives in a ``harness serve`` process at ``url``."""

    def __init__(self, url: str, tokenizer, retry_s: float = 300.0, connect_s: float = 10.0, timeout_s: float = 600.0,
                 weights_dir: str = "", return_logp: bool = False, token: str = "", max_tokens: int = 0):  # fmt: skip
        import httpx

        self.return_logp = return_logp  # ask for the sampled tokens' log-probs (pipelined runs)
        self.url, self.retry_s, self.timeout_s, self.weights_dir = url.rstrip("/"), retry_s, timeout_s, weights_dir
        self.http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(connect_s, 5.0)), headers=auth_headers(token))
        self.session = uuid.uuid4().hex[:8]  # this client's weights ids: <session>:<pushes>
        self.pushes = 0
        self.weights_id = BASE_WEIGHTS
        # The last push, for a restarted server: the serialised bytes (or the file's path), never the state
        # dict itself, whose tensors may be the trainer's live parameters (changed by the next update).
        self._pushed: dict | None = None
        info = self._request("GET", "/info", give_up_s=connect_s).json()
        vocab = len(tokenizer)
        if int(info["vocab"]) != vocab:
            raise RolloutServiceError(f"rollout.server.url={self.url} serves {info['model']} with a vocabulary of "
                                      f"{info['vocab']} tokens, this run's tokenizer has {vocab}: start the server "
                                      f"with this run's model overrides")  # fmt: skip
        served = int(info.get("limits", {}).get("max_tokens", 0))
        if max_tokens and served and max_tokens > served:  # found now, not at the first long generation
            raise RolloutServiceError(f"rollout.server.url={self.url} serves at most {served} new tokens per sample, this "
                                      f"run asks up to {max_tokens}: start the server with --max-tokens {max_tokens} "
                                      f"or lower rollout.max_response_tokens")  # fmt: skip
        self.pad_id, self.eos_ids = int(info["pad_id"]), [int(e) for e in info["eos_ids"]]
        self.server_model = info["model"]

    # ---------------------------------------------------------------- transport
    def _request(self, method: str, path: str, give_up_s: float | None = None, **kwargs) -> Any:
        """One call, retried while the server cannot be reached (refused, reset, timed out) for up
        to ``give_up_s`` (default ``rollout.server.retry_s``); HTTP errors other than 409 raise."""
        import httpx

        give_up_s = self.retry_s if give_up_s is None else give_up_s
        deadline, delay, warned = time.monotonic() + give_up_s, 0.2, False
        while True:
            try:
                response = self.http.request(method, self.url + path, **kwargs)
            except httpx.ReadTimeout:  # the server is up but slow: repeating the call would queue a duplicate
                raise RolloutServiceError(f"rollout.server.url={self.url}: {method} {path} got no answer within "
                                          f"rollout.server.timeout_s={self.timeout_s:g} s; raise it for long "
                                          f"generations") from None  # fmt: skip
            except httpx.TransportError as exc:  # refused, reset, cut off: the server is down or restarting
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RolloutServiceError(
                        f"rollout.server.url={self.url}: no rollout server answered {method} {path} for {give_up_s:.0f} s "
                        f"({type(exc).__name__}: {exc}); start one with `harness serve` (same model overrides) or "
                        f"fix rollout.server.url"
                    ) from None
                if not warned:
                    log.warning("rollout server %s unreachable (%s); retrying for up to %.0f s", self.url,
                                type(exc).__name__, left)  # fmt: skip
                    warned = True
                time.sleep(min(delay, max(left, 0.0)))
                delay = min(delay * 2, 5.0)
                continue
            if warned:
                log.warning("rollout server %s answers again", self.url)
            if response.status_code == 401:
                raise RolloutServiceError(_refused(self.url))
            if response.status_code >= 400 and response.status_code != 409:
                raise RolloutServiceError(f"rollout.server.url={self.url}: {method} {path} -> HTTP {response.status_code}: "
                                          f"{response.text[:500]}")  # fmt: skip
            return response

    # ------------------------------------------------------------------ backend
    def generate(self, prompts: list, n: int, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: list[int] | None = None) -> Generation:  # fmt: skip
        body = {"prompts": prompts, "n": n, "max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                "seeds": seeds, "weights": self.weights_id, "logp": self.return_logp}  # fmt: skip
        for _ in range(3):
            response = self._request("POST", "/generate", json=body)
            if response.status_code != 409:
                return generation_from_bytes(response.content)
            # The server holds other weights than this run pushed: it restarted. Push them again.
            log.warning("rollout server %s holds weights %s, this run %s: pushing them again", self.url,
                        response.json().get("weights"), self.weights_id)  # fmt: skip
            self._push()
        raise RolloutServiceError(f"rollout.server.url={self.url}: the server's weights keep changing under this run (is "
                                  f"another run using the same server? one run per server)")  # fmt: skip

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.pushes += 1
        self.weights_id = f"{self.session}:{self.pushes}"
        if self.weights_dir:  # shared storage: the server reads the file
            from pathlib import Path

            from safetensors.torch import save_file

            path = Path(self.weights_dir) / f"weights-{self.session}.safetensors"
            save_file({k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()}, str(path))
            self._pushed = {"json": {"path": path.name}}  # found in the server's --weights-dir, wherever it is mounted
        else:
            self._pushed = {"content": state_to_bytes(state_dict), "headers": {"content-type": "application/octet-stream"}}
        self._push()

    def _push(self) -> None:
        if self._pushed is None:  # nothing pushed yet: the server's own starting weights are the run's
            self._request("POST", "/weights", json={"reset": True})
            return
        self._request("POST", f"/weights?id={self.weights_id}", **self._pushed)

    def close(self) -> None:
        self.http.close()


def check(settings: DriverSettings) -> None:
    """``rollout.server.url``: an http(s) address, and one worker (weights are pushed by one client)."""
    url, workers = settings.rollout.server.url, settings.runtime.workers
    if not url:
        raise ConfigError("rollout.backend=remote needs rollout.server.url=http://HOST:PORT, the address of a "
                          "`harness serve` process (setting rollout.server.url alone selects it)")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"rollout.server.url={url!r}: an http(s)://host:port address of a `harness serve` "
                          f"process, or '' for an in-process engine")  # fmt: skip
    if workers > 1:
        raise ConfigError(f"rollout.server.url with runtime.workers={workers}: a rollout server serves one "
                          f"worker (weights are pushed by one client); use runtime.workers=1")  # fmt: skip


def memory(facts: MemoryFacts) -> BackendMemory:
    """Nothing on the training side: the engine's memory is the server's."""
    return BackendMemory()


@register_backend(REMOTE, summary="a `harness serve` process at rollout.server.url (chosen by setting rollout.server.url)",
                  memory=memory, check=check, colocated=False)  # fmt: skip
def build(ctx: RolloutContext) -> RemoteRollout:
    r = ctx.settings.server
    return RemoteRollout(r.url, ctx.tokenizer, retry_s=r.retry_s, connect_s=r.connect_s, timeout_s=r.timeout_s,
                         weights_dir=r.weights_dir, return_logp=ctx.return_logp, token=shared_token(r.token_file),
                         max_tokens=max(ctx.settings.max_response_tokens, ctx.settings.eval_max_response_tokens))  # fmt: skip

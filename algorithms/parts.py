"""Parts of an algorithm, registered apart so they can be crossed: advantage estimators, policy losses, loss
aggregations and KL estimators.

Every built-in algorithm keeps its paper's advantage and loss; ``algo.advantage=NAME`` or ``algo.loss=NAME``
swaps one for a registered part, so "RLOO's advantage with GSPO's loss" is a config, not a new class::

    harness run algo=grpo algo.advantage=rloo algo.loss=gspo

A part is a function with a declaration of what it needs (a group of samples per prompt, a model role,
a greedy rollout); ``check`` refuses a composition that cannot work, in one line, when the config is
checked. A part swapped in takes its paper's parameters (``paper``) unless the run sets them:
``algo=grpo algo.loss=gspo`` clips GSPO's sequence ratio at GSPO's (3e-4, 4e-4), not GRPO's 0.2, and
``algo.clip_low=...`` still wins (a value other than the algorithm's default counts as set; the run logs
where a set value departs from the paper). An algorithm's own parts read its own config, as before.
A plugin registers its own with the decorators, from its own package::

    from algorithms.parts import register_advantage

    @register_advantage("median", "group median baseline", needs_group=True)
    def median_advantage(algo, batch):
        ...  # -> ([B, T] advantages, metrics)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.core.registry import Registry

log = logging.getLogger(__name__)

# The modules that register built-in parts (beside their algorithm).
_BUILTIN_MODULES = ("algorithms.base", "algorithms.rloo", "algorithms.reinforce_pp", "algorithms.remax",
                    "algorithms.ppo", "algorithms.gpg", "algorithms.gspo", "algorithms.cispo", "algorithms.gmpo",
                    "algorithms.sapo", "algorithms.clip_cov", "algorithms.kl_cov", "algorithms.prime", "algorithms.opd", "algorithms.dapo")  # fmt: skip


@dataclass(frozen=True)
class Part:
    """A registered part: ``fn`` and what it needs of the algorithm it joins."""

    name: str
    fn: Callable[..., Any]  # advantage: (algo, batch) -> ([B, T], metrics); loss: (algo, logp, mb) -> ([b, T], stats)
    summary: str = ""
    needs_group: bool = False  # a group of 2 or more samples per prompt (a group baseline)
    needs_role: str = ""  # a model role the algorithm must declare (GAE's critic)
    needs_greedy: bool = False  # a greedy response per prompt in batch.outputs["greedy_score"] (ReMax)
    paper: dict[str, Any] = field(default_factory=dict)  # parameters: the paper's values, used where the config has none


def _registry(kind: str, key: str, group: str, decorator: str, modules: tuple[str, ...] = _BUILTIN_MODULES) -> Registry[Part]:
    """A registry of one kind of part: set by ``algo.<key>``, filled by ``@<decorator>`` and entry points ``group``."""
    return Registry(kind, builtin_modules=modules, entry_point_group=f"harness.{group}", setting=f"algo.{key}",
                    owner=lambda p: p.fn, how_to_add=f"Register your own with @{decorator} (algorithms.parts) and "
                                                     f"load it with plugins=[your.module]")  # fmt: skip


ADVANTAGES = _registry("advantage estimator", "advantage", "advantages", "register_advantage")
LOSSES = _registry("policy loss", "loss", "losses", "register_loss")
# The shared math's parts (algorithms/ops.py): how per-token losses become one number (``algo.loss_agg``), and how
# a token's KL to the reference is estimated (``algo.kl_kind``). Every algorithm reads them from its config already.
AGGREGATIONS = _registry("loss aggregation", "loss_agg", "aggregations", "register_aggregation", ("algorithms.ops",))
KL_ESTIMATORS = _registry("KL estimator", "kl_kind", "kl_estimators", "register_kl_estimator", ("algorithms.ops",))
# Hooks around the advantage: reward shaping (``algo.shaping``: the scores the advantage reads) and sampling filters
# (``algo.filter``: which groups a step trains on, refilled from fresh prompts). Unlike advantage and loss, '' (or
# 'none') means no hook, and an algorithm's own are its config's defaults (DAPO: shaping=overlong, filter=dynamic).
SHAPINGS = _registry("reward shaping", "shaping", "shapings", "register_shaping")
FILTERS = _registry("sampling filter", "filter", "filters", "register_filter")
HOOKS = (("shaping", SHAPINGS), ("filter", FILTERS))


def register_shaping(name: str, summary: str = "", **paper: Any) -> Callable:
    """Function decorator: reward shaping ``(algo, batch) -> ([B] shaped scores, metrics)``; the advantage reads the
    shaped scores, the logged rewards stay the checker's."""

    def wrap(fn: Callable) -> Callable:
        SHAPINGS.add(name, Part(name, fn, summary, paper=dict(paper)))
        return fn

    return wrap


def register_filter(name: str, summary: str = "", *, needs_group: bool = True, **paper: Any) -> Callable:
    """Function decorator: a sampling filter ``(algo, batch, sampler) -> (batch, metrics)`` (``Algorithm.select``)."""

    def wrap(fn: Callable) -> Callable:
        FILTERS.add(name, Part(name, fn, summary, needs_group=needs_group, paper=dict(paper)))
        return fn

    return wrap


def register_aggregation(name: str, summary: str = "") -> Callable:
    """Function decorator: ``(loss_mat [B, T], mask, num_tokens, num_seqs, max_len) -> scalar`` (see ops.aggregate:
    ``num_tokens`` / ``num_seqs`` are the minibatch's totals, or None for the tensor's own)."""

    def wrap(fn: Callable) -> Callable:
        AGGREGATIONS.add(name, Part(name, fn, summary))
        return fn

    return wrap


def register_kl_estimator(name: str, summary: str = "", aliases: tuple[str, ...] = ()) -> Callable:
    """Function decorator: a per-token estimator ``(logp, ref_logp) -> [B, T]`` of KL(pi || pi_ref) from samples of pi
    (the caller masks); ``aliases``: other names for it (verl's spellings)."""

    def wrap(fn: Callable) -> Callable:
        for key in (name, *aliases):
            KL_ESTIMATORS.add(key, Part(name, fn, summary))
        return fn

    return wrap


def register_advantage(name: str, summary: str = "", *, needs_group: bool = False, needs_role: str = "",
                       needs_greedy: bool = False, **paper: Any) -> Callable:  # fmt: skip
    """Function decorator: an advantage estimator ``(algo, batch) -> ([B, T] advantages, metrics)``."""

    def wrap(fn: Callable) -> Callable:
        ADVANTAGES.add(name, Part(name, fn, summary, needs_group, needs_role, needs_greedy, dict(paper)))
        return fn

    return wrap


def register_loss(name: str, summary: str = "", **paper: Any) -> Callable:
    """Function decorator: a policy loss ``(algo, logp, mb) -> ([b, T] per-token loss, stats with clipfrac and
    approx_kl)``; ``paper`` holds its parameters' published values (clip_low=3e-4, ...)."""

    def wrap(fn: Callable) -> Callable:
        LOSSES.add(name, Part(name, fn, summary, paper=dict(paper)))
        return fn

    return wrap


def param(algo: Any, part: str, name: str) -> Any:
    """A part's parameter. For the algorithm's own part, its config value; for a part swapped in
    (``algo.advantage`` / ``algo.loss``, or a hook other than the algorithm's default), the value the run set, else
    the part's paper value."""
    cfg = algo.cfg
    if part not in swapped(cfg):  # the algorithm's own method calling its own part
        if hasattr(cfg, name):
            return getattr(cfg, name)
    elif hasattr(cfg, name) and _set(cfg, name):
        return getattr(cfg, name)
    for registry in (ADVANTAGES, LOSSES, SHAPINGS, FILTERS):
        if part in registry and name in registry.get(part).paper:
            return registry.get(part).paper[name]
    if hasattr(cfg, name):
        return getattr(cfg, name)
    raise KeyError(f"part {part!r} has no parameter {name!r}")


def _set(cfg: Any, name: str) -> bool:
    """Whether the run set ``name``: its value differs from the algorithm's registered default."""
    default = _defaults(type(cfg), cfg.name)
    return default is None or getattr(default, name, None) != getattr(cfg, name)


@functools.cache
def _defaults(cls: type, name: str) -> Any:
    """The config class's defaults, built once (``param`` runs on every micro-batch); None if it needs arguments."""
    try:
        return cls(name=name)
    except TypeError:  # a config class that cannot be built bare: every value counts as set
        return None


def chosen(cfg: Any) -> tuple[str, str]:
    """(advantage, loss) a config names ('' = the algorithm's own)."""
    return str(getattr(cfg, "advantage", "") or ""), str(getattr(cfg, "loss", "") or "")


def hooks(cfg: Any) -> dict[str, str]:
    """{'shaping': name, 'filter': name} a config names ('' = none)."""
    return {kind: "" if str(getattr(cfg, kind, "") or "") == "none" else str(getattr(cfg, kind, "") or "")
            for kind, _ in HOOKS}  # fmt: skip


def changed_hooks(cfg: Any) -> dict[str, str]:
    """The hooks a config sets away from its algorithm's defaults ('none' where it removes one)."""
    default = _defaults(type(cfg), cfg.name)
    base = hooks(default) if default is not None else {kind: "" for kind, _ in HOOKS}
    return {kind: name or "none" for kind, name in hooks(cfg).items() if name != base[kind]}


def swapped(cfg: Any) -> set[str]:
    """The parts a config brings in from outside its algorithm (their parameters: set values, else the paper's)."""
    return ({*chosen(cfg), *changed_hooks(cfg).values()}) - {"", "none"}


def compose(algo: Any) -> None:
    """Swap the algorithm's own advantage and policy loss for the parts its config names, then wrap the advantage in
    the config's reward shaping and make its sampling filter the algorithm's ``select`` (in place)."""
    advantage, loss = chosen(algo.cfg)
    if advantage:
        algo.advantages = functools.partial(ADVANTAGES.get(advantage, ValueError).fn, algo)
    if loss:
        algo.policy_loss = functools.partial(LOSSES.get(loss, ValueError).fn, algo)
    named = hooks(algo.cfg)
    if named["filter"]:
        algo.select = functools.partial(FILTERS.get(named["filter"], ValueError).fn, algo)
    if named["shaping"]:
        algo.advantages = functools.partial(_shaped, SHAPINGS.get(named["shaping"], ValueError).fn, algo.advantages, algo)


def _shaped(shape: Callable, advantages: Callable, algo: Any, batch: Any) -> tuple[Any, dict[str, float]]:
    """The advantage of the shaped scores; the batch keeps the checker's scores (logged as the reward)."""
    scores, metrics = shape(algo, batch)
    checker_scores, batch.scores = batch.scores, scores
    try:
        adv, more = advantages(batch)
    finally:
        batch.scores = checker_scores
    return adv, {**metrics, **more}


def check(algo: Any) -> list[str]:
    """Refuse (ValueError, one line) a composition that cannot work; return notes for one that runs a swapped-in
    part with parameters the run set away from its paper's."""
    advantage, loss = chosen(algo.cfg)
    name, warnings = algo.cfg.name, []
    AGGREGATIONS.get(str(algo.cfg.loss_agg).replace("-", "_"), ValueError)  # verl's hyphenated spellings too
    KL_ESTIMATORS.get(str(algo.cfg.kl_kind), ValueError)
    if advantage:
        part = ADVANTAGES.get(advantage, ValueError)
        if part.needs_group and algo.samples_per_prompt < 2:
            raise ValueError(f"algo.advantage={advantage} needs a group of samples per prompt: "
                             f"algo.samples_per_prompt={algo.samples_per_prompt}, set it to 2 or more")
        if part.needs_role and not algo.needs.has(part.needs_role):
            raise ValueError(f"algo.advantage={advantage} needs a {part.needs_role} model, which {name} does not "
                             f"declare: use algo=ppo, or another advantage")
        if part.needs_greedy and not getattr(algo, "makes_greedy_baseline", False):
            raise ValueError(f"algo.advantage={advantage} needs a greedy response per prompt, which {name} does "
                             f"not generate: use algo=remax, or another advantage")
        if algo.kl_placement == "reward" and algo.cfg.kl_coef > 0:
            raise ValueError(f"algo.advantage={advantage}: {name} folds its KL into the reward its own advantage "
                             f"reads (algo.kl_coef={algo.cfg.kl_coef}); set algo.kl_coef=0 to swap the advantage")
    named = hooks(algo.cfg)
    for kind, registry in HOOKS:
        if named[kind]:
            part = registry.get(named[kind], ValueError)
            if part.needs_group and algo.samples_per_prompt < 2:
                raise ValueError(f"algo.{kind}={named[kind]} filters groups of samples per prompt: "
                                 f"algo.samples_per_prompt={algo.samples_per_prompt}, set it to 2 or more")
    outside = changed_hooks(algo.cfg)
    for kind, chosen_name, registry in (("advantage", advantage, ADVANTAGES), ("loss", loss, LOSSES),
                                        *((k, outside.get(k, "none"), r) for k, r in HOOKS)):  # fmt: skip
        if not chosen_name or chosen_name == "none":
            continue
        part = registry.get(chosen_name, ValueError)
        differs = {k: (param(algo, chosen_name, k), v) for k, v in part.paper.items() if param(algo, chosen_name, k) != v}
        if differs:
            now = ", ".join(f"algo.{k}={a}" for k, (a, _) in differs.items())
            paper = ", ".join(f"{k}={b}" for k, (_, b) in differs.items())
            warnings.append(f"algo.{kind}={chosen_name} with {now} (set; its paper: {paper})")
    return warnings


def label(cfg: Any) -> str:
    """'grpo [advantage=rloo, loss=gspo]': the composition a run trained, '' for an algorithm as registered."""
    advantage, loss = chosen(cfg)
    parts = [f"advantage={advantage}"] * bool(advantage) + [f"loss={loss}"] * bool(loss)
    parts += [f"{kind}={name}" for kind, name in changed_hooks(cfg).items()]
    return f"{cfg.name} [{', '.join(parts)}]" if parts else ""

"""Assemble the performance models of one experiment from its validated config.

The only file I/O here is reading the engine profiles named by the experiment; everything
returned is a frozen value the planner can use without touching disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from models.config import ConfigError, ExperimentSpec, default_profile_name, pd_profile_path, profile_path, rollout_nodes
from models.predictor import RolloutPredictor, batch_shape
from models.step_latency import EngineProfile, StepLatencyModel, load_profile
from models.transition import TransitionCosts, transition_costs


@dataclass(frozen=True)
class ExperimentModels:
    spec: ExperimentSpec
    profile: EngineProfile
    rollout_gpu: str
    tp_colocated: int
    tp_prefill: int
    tp_decode: int
    predictor: RolloutPredictor
    costs: TransitionCosts
    # mixed clusters (several GPU types, or several TP degrees for a role): one predictor per
    # (GPU type, TP degree), its three engines on that type's profile; empty otherwise
    variants: tuple[tuple[str, int, RolloutPredictor], ...] = ()
    variant_profiles: tuple[tuple[str, str, str], ...] = ()  # (GPU type, profile name, label)

    def engines(self) -> dict[tuple[str, str, int], StepLatencyModel]:
        """The step model of every engine a layout can start, by (role, GPU type, TP degree): the
        predictor's own engines, so that the simulator's engines and the Ray runtime's emulated
        ones run at the speed the planner priced them at."""
        p = self.predictor
        out = {("colocated", self.rollout_gpu, self.tp_colocated): p.colocated_engine,
               ("prefill", self.rollout_gpu, self.tp_prefill): p.prefill_engine,
               ("decode", self.rollout_gpu, self.tp_decode): p.decode_engine}
        for typ, tp, v in self.variants:
            for role, engine in (("colocated", v.colocated_engine), ("prefill", v.prefill_engine), ("decode", v.decode_engine)):
                out.setdefault((role, typ, tp), engine)
        return out


def serving_gpu_types(spec: ExperimentSpec) -> list[str]:
    """GPU types that can host rollout engines (reserved, elastic, lent training), in config order."""
    out: list[str] = []
    for group in spec.cluster.nodes:
        if group.gpu not in out:
            out.append(group.gpu)
    return out


def is_mixed(spec: ExperimentSpec) -> bool:
    """Several GPU types, or several TP degrees for some role: the planner needs one table per
    (role, type, degree) and the mixed program (planner/mixed.py)."""
    tp = spec.cluster.tp
    return len(serving_gpu_types(spec)) > 1 or any(len(d) > 1 for d in (tp.colocated, tp.prefill, tp.decode))


def rollout_gpu_type(spec: ExperimentSpec) -> str:
    for group in spec.cluster.nodes:
        if group.pool in ("rollout", "elastic"):
            return group.gpu
    return spec.cluster.nodes[0].gpu


def step_model(spec: ExperimentSpec, profile: EngineProfile, tp: int) -> StepLatencyModel:
    gpu = rollout_gpu_type(spec)
    return StepLatencyModel(spec.model, spec.gpu(gpu), tp, profile)


def check_profile(spec: ExperimentSpec, profile: EngineProfile, field: str) -> EngineProfile:
    """A profile is one model's step times on one GPU type: applied to another model or GPU it
    silently shifts every prediction (2x, or Infinity), so a mismatch is refused, naming the
    experiment field that chose it. Names compare as the shipped files spell them, ignoring
    case (`H800` in a cluster, `h800-...` in profile names)."""
    gpu = rollout_gpu_type(spec)
    if profile.model.lower() != spec.model_name.lower() or profile.hardware.lower() != gpu.lower():
        raise ConfigError(spec.source, field, profile.name,
                          f"a profile measured for model '{spec.model_name}' on '{gpu}' (this one is for '{profile.model}' on '{profile.hardware}')")
    return profile


def load_profiles(spec: ExperimentSpec) -> tuple[EngineProfile, EngineProfile | None]:
    """The experiment's profile, and its P/D instances' own where the deployment names one,
    each checked against the experiment's model and rollout GPU."""
    pd_path = pd_profile_path(spec)
    profile = check_profile(spec, load_profile(profile_path(spec)), spec.profile_field)
    pd = check_profile(spec, load_profile(pd_path), spec.pd_profile_field or "profile") if pd_path is not None else None
    return profile, pd


def load_fewer_engine_profiles(spec: ExperimentSpec) -> dict[int, EngineProfile]:
    """The colocated profiles the deployment names for fewer engines on a node than a full one
    runs (`profile_by_engines`), each checked against the experiment's model and rollout GPU."""
    root = profile_path(spec)
    return {n: check_profile(spec, load_profile(root.with_name(f"{name}.json")), field) for n, (name, field) in spec.colocated_by_engines.items()}


def build_models(spec: ExperimentSpec, batch: int | None = None, profile: EngineProfile | None = None, env_scale: float = 1.0,
                 pd_profile: EngineProfile | None = None, speed: float = 1.0, fewer_engines: dict[int, EngineProfile] | None = None,
                 type_speeds: Mapping[str, float] | None = None) -> ExperimentModels:
    """Predictor and transition costs for the experiment (`predictor`: the rollout GPU type at the
    smallest degree allowed per role; a mixed cluster also gets `variants`, one predictor per
    (GPU type, TP degree), which the planner's mixed program uses).

    Colocated instances use `profile` (default: the experiment's); prefill and decode instances
    use `pd_profile` (default: the experiment's P/D profile, else `profile`). `speed` scales both
    (the runtime tracker's measured speed); `type_speeds` scales each named GPU type's engines
    further (a mixed cluster's per-type speeds: the tracker's, or the emulated engines' truth).
    Colocated layouts that run fewer engines on their busiest node than a full node does use
    `fewer_engines` (by engine count; default: the deployment's, `profile_by_engines`), also
    scaled. Callers that build often pass the
    profiles, read once with `load_profiles` and `load_fewer_engine_profiles`."""
    if profile is None or (pd_profile is None and spec.pd_profile_name is not None):
        loaded, loaded_pd = load_profiles(spec)
        profile, pd_profile = profile or loaded, pd_profile or loaded_pd
    if fewer_engines is None:
        fewer_engines = load_fewer_engine_profiles(spec) if spec.colocated_by_engines else {}
    gpu = rollout_gpu_type(spec)
    per_type = dict(type_speeds or {})

    def speed_of(typ: str) -> float:
        return speed * per_type.get(typ, 1.0)

    home_speed = speed_of(gpu)
    profile = profile.scaled(home_speed)
    pd = pd_profile.scaled(home_speed) if pd_profile is not None else profile
    tp = spec.cluster.tp
    tc, tpp, tpd = tp.colocated[0], tp.prefill[0], tp.decode[0]
    predictor = RolloutPredictor(
        shape=batch_shape(spec.workload, batch, env_scale),
        colocated_engine=step_model(spec, profile, tc),
        prefill_engine=step_model(spec, pd, tpp),
        decode_engine=step_model(spec, pd, tpd),
        kv_link_gb_s=spec.cluster.inter_node_gb_s * tpp,
        colocated_by_engines=tuple((n, step_model(spec, f.scaled(home_speed), tc)) for n, f in sorted(fewer_engines.items())),
        rollout_nodes=rollout_nodes(spec.cluster),
        wait_tail=spec.predictor.wait_tail,
    )
    costs = transition_costs(spec.model, spec.gpu(gpu), spec.cluster, tc, spec.transition_costs, max(spec.cluster.gpus_in_pool("training"), 1))
    variants, labels = variant_predictors(spec, predictor, profile, pd, speed_of) if is_mixed(spec) else ((), ())
    return ExperimentModels(spec, profile, gpu, tc, tpp, tpd, predictor, costs, variants, labels)


def variant_predictors(spec: ExperimentSpec, home: RolloutPredictor, profile: EngineProfile, pd: EngineProfile,
                       speed_of: Callable[[str], float]) -> tuple[tuple[tuple[str, int, RolloutPredictor], ...], tuple[tuple[str, str, str], ...]]:
    """One predictor per (GPU type, TP degree) of a mixed cluster.

    The rollout type keeps the experiment's profiles (`profile`, `pd`: already scaled); every
    other type reads its own (`<type>-<model>.json`, measured or datasheet-derived as its label
    says; load_experiment checked that it exists), scaled by `speed_of(type)`. A decode
    instance's path charges its trajectory's unloaded prefill and KV send on the rollout type's
    prefill instance at its smallest degree (`home`'s), whatever the decode kind: each role's
    table then depends on its own kind alone and the program stays separable. Charged on the
    decode kind's own type and degree instead, an H20 TP1 decode path paid 244 s of prefill over
    45 turns where the H800 TP1 instances that prefill took 38 s, and held H20 decode layouts
    were predicted 9.8-16.6% over the simulator (experiments/mixed_degrees.py)."""
    gpu = rollout_gpu_type(spec)
    tp = spec.cluster.tp
    degrees = sorted(set(tp.colocated) | set(tp.prefill) | set(tp.decode))
    out, labels = [], []
    for typ in serving_gpu_types(spec):
        if typ == gpu:
            col, dis = profile, pd
        else:
            name = default_profile_name(typ, spec.model_name)
            col = dis = load_profile(profile_path(spec).with_name(f"{name}.json")).scaled(speed_of(typ))
        labels.append((typ, col.name, col.label))
        for t in degrees:
            step = StepLatencyModel(spec.model, spec.gpu(typ), t, col)
            pd_step = StepLatencyModel(spec.model, spec.gpu(typ), t, dis)
            out.append((typ, t, RolloutPredictor(home.shape, step, pd_step, pd_step, spec.cluster.inter_node_gb_s * t, wait_tail=home.wait_tail,
                                                 decode_prefill=(home.prefill_engine, home.kv_link_gb_s))))
    return tuple(out), tuple(labels)


def rollout_gpu_count(spec: ExperimentSpec, include_elastic: bool = True, gpu_type: str | None = None) -> int:
    """Reserved rollout GPUs, and elastic ones unless told not to (of one GPU type only, if given)."""
    n = spec.cluster.gpus_in_pool("rollout", gpu_type)
    return n + (spec.cluster.gpus_in_pool("elastic", gpu_type) if include_elastic else 0)

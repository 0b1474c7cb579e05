"""Sweepable keys: every numeric leaf of the experiment sections the simulator and planner read.

An override is applied by dumping the validated experiment, setting the dotted path and
validating the whole `ExperimentSpec` again, so a swept value passes the same constraints
as a value written in the YAML file (a negative weight or a fractional integer is refused)
and the simulator sees exactly the re-validated object.
"""

from __future__ import annotations

import math
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from models.config import ConfigError, ExperimentSpec, check_trace_caps

# Sections a simulation depends on (hardware, model and runtime are identities, not knobs).
SECTIONS = ("costs", "transition_costs", "training", "workload", "cluster", "solver", "trace")
# Set per run by --hours (the simulated window), so a swept value would never reach the simulator.
EXCLUDED = ("trace.hours",)
Number = Union[int, float]


def _leaf_kind(annotation: Any) -> type | None:
    """int or float when the field holds a number (possibly Optional / Annotated), else None."""
    if annotation is bool:
        return None
    if annotation in (int, float):
        return annotation  # type: ignore[return-value]
    origin = get_origin(annotation)
    if origin in (list, dict, tuple, set):
        return None
    kinds = {_leaf_kind(a) for a in get_args(annotation)} - {None}
    if origin in (Union, types.UnionType) or kinds:
        return float if float in kinds else (int if int in kinds else None)
    return None


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (list, dict, tuple, set):
        return None
    for a in get_args(annotation):
        found = _submodel(a)
        if found is not None:
            return found
    return None


def _walk(model: type[BaseModel], prefix: str) -> dict[str, type]:
    out: dict[str, type] = {}
    for name, field in model.model_fields.items():
        kind = _leaf_kind(field.annotation)
        if kind is not None:
            out[f"{prefix}{name}"] = kind
            continue
        sub = _submodel(field.annotation)
        if sub is not None:
            out.update(_walk(sub, f"{prefix}{name}."))
    return out


def numeric_keys(spec: ExperimentSpec) -> dict[str, type]:
    """Dotted key -> int or float, for every numeric field that can be swept on this experiment."""
    out: dict[str, type] = {}
    for section in SECTIONS:
        if section == "trace" and spec.trace is None:
            continue
        sub = _submodel(ExperimentSpec.model_fields[section].annotation)
        assert sub is not None
        out.update(_walk(sub, f"{section}."))
    return {k: v for k, v in sorted(out.items()) if k not in EXCLUDED}


def _bad_set(item: str, field: str, allowed: str, spec: ExperimentSpec) -> ConfigError:
    return ConfigError("--set", field, item, f"{allowed}; valid keys: {', '.join(numeric_keys(spec))}")


def _number(text: str, kind: type) -> Number | None:
    """The value as the field's kind, or None when it is not a finite number of that kind."""
    try:
        v = float(text)
    except ValueError:
        return None
    if not math.isfinite(v):
        return None
    if kind is int:
        return int(v) if v.is_integer() else None
    return v


def parse_sets(items: list[str], spec: ExperimentSpec) -> dict[str, list[Number]]:
    """`key=v1,v2,...` strings -> {key: [values]}; ConfigError (listing the valid keys) on bad input."""
    keys = numeric_keys(spec)
    if not items:
        raise _bad_set("", "--set", "at least one --set key=v1,v2,...", spec)
    out: dict[str, list[Number]] = {}
    for item in items:
        if "=" not in item:
            raise _bad_set(item, "--set", "key=v1,v2,... (no '=' found)", spec)
        key, _, raw = item.partition("=")
        key = key.strip()
        if key not in keys:
            raise _bad_set(item, key or "<empty key>", "a known numeric key", spec)
        if key in out:
            raise _bad_set(item, key, "each key at most once", spec)
        texts = [t.strip() for t in raw.split(",")]
        if not any(texts):
            raise _bad_set(item, key, "a non-empty comma-separated list of numbers", spec)
        values: list[Number] = []
        for t in texts:
            v = _number(t, keys[key]) if t else None
            if v is None:
                kind = "integers" if keys[key] is int else "numbers"
                raise _bad_set(item, key, f"a comma-separated list of finite {kind} (bad entry {t!r})", spec)
            if v not in values:
                values.append(v)
        out[key] = values
    return out


def _set_path(data: dict[str, Any], key: str, value: Number) -> None:
    parts = key.split(".")
    cur = data
    for p in parts[:-1]:
        cur = cur[p]
    cur[parts[-1]] = value


def _get_path(obj: Any, key: str) -> Any:
    for p in key.split("."):
        obj = getattr(obj, p)
    return obj


def current_values(spec: ExperimentSpec, keys: list[str]) -> dict[str, Any]:
    """The values the experiment holds at `keys` (what a simulation of it really uses)."""
    return {k: _get_path(spec, k) for k in keys}


def apply_overrides(spec: ExperimentSpec, values: dict[str, Number]) -> ExperimentSpec:
    """A new, fully re-validated experiment with `values` set; ConfigError names the key on a bad value."""
    if not values:
        return spec
    data = spec.model_dump()
    for k, v in values.items():
        _set_path(data, k, v)
    try:
        new = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError("--set", loc, err.get("input"), msg) from None
    check_trace_caps(new.cluster, new.trace, new.elastic_traces, "--set")
    return new

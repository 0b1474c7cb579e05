"""Bad configs give ONE clear error naming file, field, bad value and what is allowed (CLI: exit 2, no traceback)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from models.config import ConfigError, load_experiment

EXPERIMENT = "experiments/pd-crossover.yaml"
WORKLOAD = "workloads/paper-8b-calibrated.yaml"  # the default experiment's
CLUSTER = "clusters/crossover-16xh800.yaml"
TRACED = "experiments/default.yaml"  # one trace for the elastic pool (12 H800)
MIXED = "experiments/mixed-elastic.yaml"  # elastic_traces: 12 H20 and 12 A100, each with its own trace


def edit_yaml(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@dataclass(frozen=True)
class Mistake:
    """One kind of config mistake and the parts its message must name."""

    name: str
    file: str  # relative to the configs root: the file the message must name
    break_it: Callable[[Path], None]
    field: str
    value: str  # substring of the reported bad value
    allowed: str  # substring of what is allowed
    experiment: str = EXPERIMENT  # the experiment file that is loaded


def _set(rel: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda root: edit_yaml(root / rel, change)


MISTAKES = [
    Mistake("unknown experiment field", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(batch_sise=64)), "batch_sise", "64", "'workload'"),
    Mistake("unknown model", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(model="qwen4-1t")), "model", "qwen4-1t", "qwen3-30b-a3b"),
    Mistake("unknown workload", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(workload="swe-agentik")), "workload", "swe-agentik", "swe-agentic"),
    Mistake("unknown cluster", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(cluster="moon-base")), "cluster", "moon-base", "crossover-16xh800"),
    Mistake("missing required field", EXPERIMENT, _set(EXPERIMENT, lambda d: d.pop("model")), "model", "<missing>", "required"),
    Mistake("negative number", WORKLOAD, _set(WORKLOAD, lambda d: d["env_latency_s"].update(mean=-1.5)), "env_latency_s.mean", "-1.5", "greater than or equal to 0"),
    Mistake("relative gap above its range", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(solver={"backend": "cbc", "relative_gap": 0.7})),
            "solver.relative_gap", "0.7", "less than or equal to 0.5"),
    Mistake("zero batch", WORKLOAD, _set(WORKLOAD, lambda d: d.update(trajectories_per_batch=0)), "trajectories_per_batch", "0", "greater than 0"),
    Mistake("wrong type", WORKLOAD, _set(WORKLOAD, lambda d: d.update(trajectories_per_batch="many")), "trajectories_per_batch", "many", "valid integer"),
    Mistake("uniform without max", WORKLOAD, _set(WORKLOAD, lambda d: d.update(turns={"kind": "uniform", "min": 3})), "turns", "uniform", "min and max"),
    Mistake("min greater than max", WORKLOAD, _set(WORKLOAD, lambda d: d.update(turns={"kind": "lognormal", "mean": 5, "min": 9, "max": 3})), "turns", "'min': 9", "must be <= max"),
    Mistake("unknown distribution kind", WORKLOAD, _set(WORKLOAD, lambda d: d["turns"].update(kind="poisson")), "turns.kind", "poisson", "'lognormal'"),
    Mistake("unknown distribution parameter", WORKLOAD, _set(WORKLOAD, lambda d: d["turns"].update(sigma=2)), "turns.sigma", "2", "'cv'"),
    Mistake("group size does not divide batch", WORKLOAD, _set(WORKLOAD, lambda d: d.update(group_size=5)), "group_size", "5", "divisor of trajectories_per_batch"),
    Mistake("TP not a power of two", CLUSTER, _set(CLUSTER, lambda d: d["tp"].update(prefill=[3])), "tp.prefill", "3", "power of two"),
    Mistake("TP degrees one of which is not a power of two", CLUSTER, _set(CLUSTER, lambda d: d["tp"].update(decode=[1, 3])), "tp.decode", "[1, 3]",
            "a power of two (1, 2, 4, 8, ...) for every degree; 3 is not"),
    Mistake("a trace section that is a path", MIXED, _set(MIXED, lambda d: d["elastic_traces"].update(H20="data/x.json")), "elastic_traces.H20", "data/x.json",
            "a mapping of trace fields: path, format, gpus_per_instance, time_scale, max_gpus, ...", MIXED),
    Mistake("an empty runtime section", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(runtime=None)), "runtime", "None", "a mapping of runtime fields: backend, task,"),
    Mistake("a node group that is a number", CLUSTER, _set(CLUSTER, lambda d: d["nodes"].append(8)), "nodes.1", "8", "a mapping of node group fields: count, gpus_per_node, gpu, pool"),
    Mistake("TP larger than a node", CLUSTER, _set(CLUSTER, lambda d: d["tp"].update(decode=[16])), "tp.decode", "16", "<= gpus_per_node of nodes.0 (H800, 8 GPUs per node)"),
    Mistake("TP larger than one node group's nodes", "clusters/mixed-elastic.yaml", _set("clusters/mixed-elastic.yaml", lambda d: d["nodes"][2].update(gpus_per_node=3)),
            "tp.colocated", "4", "<= gpus_per_node of nodes.2 (H20, 3 GPUs per node): TP stays inside a node", MIXED),
    Mistake("unknown GPU type", CLUSTER, _set(CLUSTER, lambda d: d["nodes"][0].update(gpu="H900")), "nodes.0.gpu", "H900", "'H800'"),
    Mistake("GPU type without a profile for the model", CLUSTER,
            _set(CLUSTER, lambda d: d["nodes"].append({"count": 1, "gpus_per_node": 8, "gpu": "cpu", "pool": "elastic"})), "nodes.1.gpu", "cpu", "'H20'"),
    Mistake("elastic trace for a GPU type with no elastic nodes", EXPERIMENT,
            _set(EXPERIMENT, lambda d: d.update(elastic_traces={"H20": {"path": "data/traces/skypilot/availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json"}})),
            "elastic_traces.H20", "H20", "elastic node group"),
    Mistake("unknown pool", CLUSTER, _set(CLUSTER, lambda d: d["nodes"][0].update(pool="spot")), "nodes.0.pool", "spot", "'elastic'"),
    Mistake("missing profile", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(profile="h900-qwen3-30b-a3b")), "profile", "h900-qwen3-30b-a3b", "h800-qwen3-30b-a3b"),
    Mistake("missing per-engine-count profile", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(profile_by_engines={4: "h800-x4"})), "profile_by_engines.4", "h800-x4", "h800-qwen3-30b-a3b"),
    Mistake("bad engine count", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(profile_by_engines={0: "h800-qwen3-30b-a3b"})), "profile_by_engines.0.[key]", "0", "greater than 0"),
    Mistake("bad workload override", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(workload_overrides={"trajectories_per_batch": -8})), "workload_overrides.trajectories_per_batch", "-8", "greater than 0"),
    Mistake("unknown workload override", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(workload_overrides={"turnz": 3})), "workload_overrides.turnz", "turnz", "'turns'"),
    Mistake("unknown runtime device", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(runtime={"device": "tpu"})), "runtime.device", "tpu", "'cuda'"),
    Mistake("emulated slowdown of a GPU type the cluster lacks", EXPERIMENT,
            _set(EXPERIMENT, lambda d: d.update(runtime={"backend": "emulated", "emulated_slowdown": {"A100": 2.0}})), "runtime.emulated_slowdown.A100", "A100", "'H800'"),
    Mistake("emulated slowdown of real engines", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(runtime={"emulated_slowdown": {"H800": 2.0}})),
            "runtime.emulated_slowdown", "{'H800': 2.0}", "only with runtime.backend: emulated (runtime.backend is 'vllm', the default;"),
    Mistake("emulated slowdown of engines set to vllm", EXPERIMENT,
            _set(EXPERIMENT, lambda d: d.update(runtime={"backend": "vllm", "emulated_slowdown": {"H800": 2.0}})),
            "runtime.emulated_slowdown", "{'H800': 2.0}", "(runtime.backend is 'vllm'; real engines"),
    Mistake("zero emulated slowdown", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(runtime={"backend": "emulated", "emulated_slowdown": {"H800": 0}})),
            "runtime.emulated_slowdown.H800", "0", "greater than 0"),
    Mistake("predictor option not a boolean", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(predictor={"wait_tail": "sometimes"})),
            "predictor.wait_tail", "sometimes", "valid boolean"),
    Mistake("unknown predictor option", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(predictor={"tail": True})), "predictor.tail", "True", "'wait_tail'"),
    Mistake("negative cost weight", EXPERIMENT, _set(EXPERIMENT, lambda d: d.update(costs={"mode_switch_margin": -0.1})), "costs.mode_switch_margin", "-0.1", "greater than or equal to 0"),
    Mistake("bad hardware number", "hardware.yaml", _set("hardware.yaml", lambda d: d["gpus"]["H800"].update(hbm_tb_s=0)), "gpus.H800.hbm_tb_s", "0", "greater than 0"),
    Mistake("more active experts than experts", "llms.yaml", _set("llms.yaml", lambda d: d["models"]["qwen3-30b-a3b"]["moe"].update(active_experts=200)), "models.qwen3-30b-a3b.moe", "200", "active_experts must be <= experts"),
    Mistake("trace capped above the elastic pool", TRACED, _set(TRACED, lambda d: d["trace"].update(max_gpus=500)),
            "trace.max_gpus", "500", "at most 12 (the elastic GPUs)", TRACED),
    Mistake("elastic trace capped above its type's pool", MIXED, _set(MIXED, lambda d: d["elastic_traces"]["H20"].update(max_gpus=351)),
            "elastic_traces.H20.max_gpus", "351", "at most 12 (the H20 elastic GPUs)", MIXED),
    Mistake("elastic events beside elastic traces", MIXED, _set(MIXED, lambda d: d.update(runtime={"elastic_events": [{"at_s": 0, "available": 4}]})),
            "runtime.elastic_events", "'available': 4", "absent when elastic_traces drives each elastic type", MIXED),
    Mistake("elastic events beside a trace", TRACED, _set(TRACED, lambda d: d.update(runtime={"elastic_events": [{"at_s": 0, "available": 4}]})),
            "runtime.elastic_events", "'available': 4", "absent when trace drives the elastic pool", TRACED),
    Mistake("malformed YAML", EXPERIMENT, lambda root: (root / EXPERIMENT).write_text("name: x\nmodel: [qwen3-8b\n"), "<yaml>", "line", "valid YAML"),
    Mistake("top level not a mapping", EXPERIMENT, lambda root: (root / EXPERIMENT).write_text("- qwen3-8b\n- swe-agentic\n"), "<top level>", "list", "mapping"),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
def test_mistake_gives_one_clear_message(config_tree: Path, mistake: Mistake) -> None:
    mistake.break_it(config_tree)
    with pytest.raises(ConfigError) as info:
        load_experiment(config_tree / mistake.experiment)
    err = info.value
    assert Path(err.file).resolve() == (config_tree / mistake.file).resolve()
    assert err.field == mistake.field
    assert mistake.value in str(err.value)
    assert mistake.allowed in err.allowed
    text = str(err)
    assert "\n" not in text
    assert all(part in text for part in (mistake.file.split("/")[-1], mistake.field, mistake.allowed))


def test_trace_and_elastic_traces_together(config_tree: Path) -> None:
    """One trace for the whole elastic pool and one per elastic type would drive the same GPUs twice."""
    rel = "experiments/mixed-elastic.yaml"
    edit_yaml(config_tree / rel, lambda d: d.update(trace={"path": "x.json"}))
    with pytest.raises(ConfigError) as info:
        load_experiment(config_tree / rel)
    assert (info.value.field, info.value.value) == ("trace", "x.json") and "absent when elastic_traces" in info.value.allowed
    assert Path(info.value.file).resolve() == (config_tree / rel).resolve()


@pytest.mark.parametrize("setting, field, allowed", [
    ({"path": "data/traces/nope.json"}, "path", "an existing trace file"),
    ({"hours": 5000}, "hours", "(the trace spans 394.67 h) in "),
    ({"offset_hours": 5000}, "offset_hours", "(the trace spans 394.67 h) in "),
], ids=["path", "hours", "offset_hours"])
def test_a_per_type_trace_setting_names_its_own_field(config_tree: Path, setting: dict[str, Any], field: str, allowed: str) -> None:
    """Read when the trace loads: the error names `elastic_traces.<type>.<field>` in the experiment
    file (not `trace.<field>` in the trace file; its limit comes from the trace, which `allowed` names)."""
    from runtime.offline_plan import load_typed_windows

    edit_yaml(config_tree / MIXED, lambda d: d["elastic_traces"]["H20"].update(setting))
    spec = load_experiment(config_tree / MIXED)
    with pytest.raises(ConfigError) as info:
        load_typed_windows(spec)
    err = info.value
    assert Path(err.file).resolve() == (config_tree / MIXED).resolve() and err.field == f"elastic_traces.H20.{field}", str(err)
    assert str(next(iter(setting.values()))).removeprefix("data/traces/") in str(err.value) and allowed in err.allowed, str(err)
    if field != "path":
        assert err.allowed.endswith("us-west-2a_v100_1.json"), str(err)


def test_missing_experiment_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(tmp_path / "nope.yaml")
    assert info.value.field == "<file>" and "nope.yaml" in str(info.value) and "existing YAML file" in info.value.allowed


def test_bad_profile_json(config_tree: Path) -> None:
    prof = config_tree / "profiles" / "h800-qwen3-30b-a3b.json"
    prof.write_text(prof.read_text().replace('"weights": 1.2', '"weights": -1.2'))
    from models.builder import build_models

    spec = load_experiment(config_tree / EXPERIMENT)
    with pytest.raises(ConfigError) as info:
        build_models(spec)
    assert info.value.field == "coefficients.prefill.weights" and info.value.value == -1.2 and ">= 0" in info.value.allowed


def test_profile_matching_the_deployment_is_chosen(config_tree: Path) -> None:
    """profile_by_engines: the profile measured with as many engines per node as the cluster runs replaces `profile`."""
    assert load_experiment(config_tree / EXPERIMENT).profile_name == "h800-qwen3-30b-a3b"
    edit_yaml(config_tree / EXPERIMENT, lambda d: d.update(profile_by_engines={2: "h800-qwen3-8b", 4: "h20-qwen3-30b-a3b"}))
    # crossover-16xh800: 8 GPUs per node, TP2 colocated engines -> 4 engines share a node
    assert load_experiment(config_tree / EXPERIMENT).profile_name == "h20-qwen3-30b-a3b"


def test_valid_configs_load(config_tree: Path) -> None:
    """The shipped experiment files are valid (so every failure above comes from the one mistake)."""
    for exp in sorted((config_tree / "experiments").glob("*.yaml")):
        spec = load_experiment(exp)
        assert spec.name == exp.stem


CLI_MISTAKES = ["unknown model", "TP not a power of two", "group size does not divide batch", "malformed YAML", "missing profile", "wrong type"]


@pytest.mark.parametrize("name", CLI_MISTAKES)
def test_cli_reports_mistake_in_one_line(config_tree: Path, name: str, pearl: Callable[..., Any]) -> None:
    mistake = next(m for m in MISTAKES if m.name == name)
    mistake.break_it(config_tree)
    res = pearl("predict", "--config", str(config_tree / mistake.experiment))
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert mistake.field in lines[0] and mistake.allowed in lines[0] and mistake.file.split("/")[-1] in lines[0]
    assert res.stdout == ""


def test_cli_missing_config_file(tmp_path: Path, pearl: Callable[..., Any]) -> None:
    res = pearl("predict", "--config", str(tmp_path / "absent.yaml"), "--json")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "absent.yaml" in lines[0] and "Traceback" not in res.stderr

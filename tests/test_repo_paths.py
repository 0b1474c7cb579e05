"""Results name their configs relative to the repository, so shipped JSON carries no checkout path."""

from __future__ import annotations

import json
from pathlib import Path

from models.config import CONFIG_ROOT, repo_relative


def test_a_path_inside_the_repository_is_written_relative_to_it(tmp_path: Path, monkeypatch) -> None:
    inside = CONFIG_ROOT / "experiments" / "mixed-elastic.yaml"
    assert repo_relative(inside) == "configs/experiments/mixed-elastic.yaml"
    assert repo_relative(str(inside)) == "configs/experiments/mixed-elastic.yaml"
    monkeypatch.chdir(CONFIG_ROOT.parent)
    assert repo_relative("configs/experiments/mixed-elastic.yaml") == "configs/experiments/mixed-elastic.yaml"
    outside = tmp_path / "mine.yaml"
    assert repo_relative(outside) == str(outside)


def test_no_shipped_result_names_an_absolute_path() -> None:
    """Every config, experiment or trace path in results/*.json is the repository's own, relative."""

    def paths(node: object) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k in ("config", "experiment", "path") and isinstance(v, str)] + [
                p for v in node.values() for p in paths(v)]
        if isinstance(node, list):
            return [p for v in node for p in paths(v)]
        return []

    named = {f.name: paths(json.loads(f.read_text())) for f in (CONFIG_ROOT.parent / "results").glob("*.json")}
    assert {k: absolute for k, v in named.items() if (absolute := [p for p in v if p.startswith("/")])} == {}
    assert sum(len(v) for v in named.values()) >= 20

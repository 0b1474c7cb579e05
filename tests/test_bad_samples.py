"""`pearl fit` on bad samples files (issue 16, family 7): exit 2 with one `pearl: error:` line
naming the file and the field, never a traceback, a hang, or a "measured" profile whose error
is NaN or a fake 0%.

The corpus under tests/data/bad/samples/ holds one small file per mistake (written from slices
of configs/profiles/samples/); the property test mutates a slice of a shipped file field by field.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from models.config import load_hardware, load_llms
from models.fit import StepSample, write_samples
from models.step_latency import StepLatencyModel, StepShape, load_profile
from cli_cases import Outcome, invoke, one_error, strict_loads

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "data" / "bad" / "samples"
SHIPPED = ROOT / "configs" / "profiles" / "samples" / "cpu-tiny-served-pd.jsonl"
TIME_BOUND_S = 10.0  # one `pearl fit` of a few dozen samples takes ~0.1 s

# corpus file -> the field its one error line names
EXPECTED = {
    "binary.jsonl": "<file>",
    "nul-bytes.jsonl": "<file>",
    "empty.jsonl": "<samples>",
    "header-only.jsonl": "<samples>",
    "line-is-a-list.jsonl": "line 3",
    "line-is-a-number.jsonl": "line 3",
    "line-is-a-string.jsonl": "line 3",
    "line-is-null.jsonl": "line 3",
    "truncated-line.jsonl": "line 3",
    "deep-nesting.jsonl": "line 3",
    "seconds-string.jsonl": "line 3.seconds",
    "seconds-bool.jsonl": "line 3.seconds",
    "seconds-infinity.jsonl": "line 3.seconds",
    "seconds-overflow.jsonl": "line 3.seconds",
    "seconds-nan.jsonl": "line 3",  # with kind: "kind prefill|decode|handoff and seconds > 0"
    "seconds-negative.jsonl": "line 3",
    "seconds-subnormal.jsonl": "line 3.seconds",
    "seconds-missing.jsonl": "line 3.seconds",
    "seconds-duplicated.jsonl": "line 3.seconds",
    "tokens-string.jsonl": "line 2.prefill_tokens",
    "tokens-negative.jsonl": "line 2.prefill_tokens",
    "tokens-huge.jsonl": "line 2.prefill_tokens",
    "tokens-int-overflow.jsonl": "line 2.prefill_tokens",
    "tokens-fractional.jsonl": "line 2.prefill_tokens",
    "prefix-nan.jsonl": "line 2.prefill_prefix_tokens",
    "requests-negative.jsonl": "line 2.prefill_requests",
    "requests-null.jsonl": "line 2.prefill_requests",
    "seqs-bool.jsonl": "line 3.decode_seqs",
    "seqs-fractional.jsonl": "line 3.decode_seqs",
    "seqs-huge.jsonl": "line 3.decode_seqs",
    "context-infinity.jsonl": "line 3.decode_context_tokens",
    "context-object.jsonl": "line 3.decode_context_tokens",
    "kind-unknown.jsonl": "line 3",
    "kind-number.jsonl": "line 3",
    "unknown-field.jsonl": "line 3.repeat_sprad",
    "repeat-spread-infinity.jsonl": "line 3.repeat_spread",
    "header-is-a-list.jsonl": "line 1.header",
    "header-is-a-string.jsonl": "line 1.header",
    "header-tp-zero.jsonl": "line 1.header.tp",
    "header-tp-negative.jsonl": "line 1.header.tp",
    "header-tp-fractional.jsonl": "line 1.header.tp",
    "header-tp-string.jsonl": "line 1.header.tp",
    "header-tp-huge.jsonl": "line 1.header.tp",
    "header-engine-nan.jsonl": "line 1.header.engine.kv_cache_gib",
    "header-engine-not-object.jsonl": "header.engine",
    "header-batched-tokens-negative.jsonl": "header.engine.max_num_batched_tokens",
    "header-load-avg-number.jsonl": "header.load_avg",
    "header-steal-out-of-range.jsonl": "header.steal_pct",
    "header-model-unknown.jsonl": "header.model",
    "header-model-missing.jsonl": "header.model",
    "header-model-list.jsonl": "header.model",
    "header-hardware-unknown.jsonl": "header.hardware",
    "header-twice.jsonl": "line 3.header",
    "header-with-sample-fields.jsonl": "line 1",
    "no-decode-samples.jsonl": "kind",
    # Degenerate data: every line valid, the set unable to identify or judge a fit.
    "degenerate-all-identical.jsonl": "prefill samples",
    "degenerate-one-per-kind.jsonl": "prefill samples",
    "degenerate-two-decode-shapes.jsonl": "decode samples",
    "degenerate-one-handoff.jsonl": "handoff samples",
}


def pearl_fit(samples: Path | str, out: Path, *flags: str) -> tuple[Outcome, float]:
    res = invoke(["fit", "--samples", str(samples), "--out", str(out), *flags], 2 * TIME_BOUND_S)
    return res, res.seconds


def one_error_line(res: Outcome) -> str:
    """One clear error (cli_cases.one_error): exit 2, exactly one `pearl: error:` line."""
    return one_error(res).string


def assert_finite_fit(res: Outcome, out: Path) -> None:
    """Exit 0 with strict JSON whose reported errors and coefficients are finite numbers."""
    assert res.exit_code == 0 and res.exception is None, (res.exit_code, repr(res.exception), res.stderr)
    report = strict_loads(res.stdout)
    for key in ("train_mape_pct", "holdout_mape_pct"):
        assert report[key] and all(isinstance(v, (int, float)) and math.isfinite(v) for v in report[key].values()), report[key]
    assert all(math.isfinite(v) for c in report["coefficients"].values() for v in c.values())
    assert all(n >= 1 for n in report["n_holdout"].values())
    assert strict_loads(out.read_text())["label"] == "measured"


def test_corpus_is_listed() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file_is_one_clear_error(name: str, tmp_path: Path) -> None:
    path = CORPUS / name
    res, elapsed = pearl_fit(path, tmp_path / "out.json", "--json")
    line = one_error_line(res)
    assert str(path) in line and f"field '{EXPECTED[name]}'" in line, line
    assert not (tmp_path / "out.json").exists() and elapsed < TIME_BOUND_S


def test_degenerate_error_states_what_is_needed(tmp_path: Path) -> None:
    res, _ = pearl_fit(CORPUS / "degenerate-two-decode-shapes.jsonl", tmp_path / "out.json")
    line = one_error_line(res)
    assert "2 distinct shapes to fit, spanning 2 independent terms" in line and "here >= 3; 9 always suffice" in line, line


def test_samples_path_that_is_no_file(tmp_path: Path) -> None:
    """A directory, and a FIFO (reading one would block forever), are refused before any read."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo):
        line = one_error_line(pearl_fit(path, tmp_path / "out.json")[0])
        assert str(path) in line and "field '<file>'" in line, line


def _slice(path: Path, per_kind: int = 8) -> str:
    """The header and the first `per_kind` samples of each kind of a shipped samples file."""
    lines = path.read_text().splitlines()
    counts: dict[str, int] = {}
    keep = [lines[0]]
    for line in lines[1:]:
        kind = json.loads(line)["kind"]
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= per_kind:
            keep.append(line)
    return "\n".join(keep) + "\n"


def test_flags_are_blamed_for_their_values(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(_slice(SHIPPED))
    (tmp_path / "a-file").write_text("")
    cases = [
        (["--model", "gpt-17"], tmp_path / "out.json", "'--model'"),
        (["--hardware", "tpu9"], tmp_path / "out.json", "'--hardware'"),
        ([], tmp_path, "'--out'"),  # a directory
        ([], tmp_path / "a-file" / "out.json", "'--out'"),  # under a regular file
    ]
    for flags, out, field in cases:
        res, elapsed = pearl_fit(good, out, *flags)
        line = one_error_line(res)
        assert field in line and elapsed < TIME_BOUND_S, (flags, line)
    # and the same file fits when nothing is wrong; more folds than samples is leave-one-out
    res, _ = pearl_fit(good, tmp_path / "out.json", "--json")
    assert_finite_fit(res, tmp_path / "out.json")
    res, _ = pearl_fit(good, tmp_path / "out.json", "--holdout-every", "1000", "--json")
    assert_finite_fit(res, tmp_path / "out.json")
    assert strict_loads(res.stdout)["n_holdout"] == {"prefill": 8, "decode": 8, "handoff": 8}


def test_smallest_profiling_grid_still_fits(tmp_path: Path) -> None:
    """The identifiability rule accepts the 8-point `tiny` grid that `pearl profile --grid tiny`
    measures (tests/test_profile_real_vllm.py fits it holding out every 3rd or 4th sample)."""
    llm, gpu = load_llms().models["tiny"], load_hardware().gpus["cpu"]
    engine = StepLatencyModel(llm, gpu, 1, load_profile(ROOT / "configs/profiles/cpu-tiny.json"))
    rng = np.random.default_rng(0)
    samples = []
    for n in (1, 16):
        for prompt in (16, 128):
            for ctx in (0, 64):
                pre = StepShape(n * prompt, n, n * ctx, 0, 0)
                dec = StepShape(0, 0, 0, n, n * (prompt + ctx + 2.5))
                samples.append(StepSample("prefill", n * prompt, n, n * ctx, 0, 0, float(engine.step_time(pre)) * (1 + rng.normal(0, 0.03))))
                samples.append(StepSample("decode", 0, 0, 0, n, n * (prompt + ctx + 2.5), float(engine.step_time(dec)) * (1 + rng.normal(0, 0.03))))
    path = tmp_path / "tiny-grid.jsonl"
    write_samples(path, {"model": "tiny", "hardware": "cpu", "tp": 1}, samples)
    for every in ("3", "4"):
        res, _ = pearl_fit(path, tmp_path / "out.json", "--holdout-every", every, "--json")
        assert_finite_fit(res, tmp_path / "out.json")


# ----------------------------------------------------------------------------- property test
BASE = _slice(SHIPPED).splitlines()  # header + 8 prefill, 8 decode, 8 handoff samples
BAD_VALUES = [
    float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 10**30, 10**400, 2**63, 1e10, -1, -1e-9, 0, 0.5, 1.5, 5e-324,
    1, 64, "1", "", "NaN", True, False, None, [], {}, [1, 2], {"a": 1},
]
LINE_REPLACEMENTS = ["[1, 2]", "3", '"decode"', "null", "{}", "{", '{"header": {}}', "\x00\x01"]


@st.composite
def mutated_file(draw: st.DrawFn) -> bytes:
    """BASE with one thing wrong: a field set to a bad value, deleted or repeated; a line
    replaced by something that is no sample; or binary bytes in place of a line."""
    lines = list(BASE)
    i = draw(st.integers(0, len(lines) - 1))
    action = draw(st.sampled_from(["set", "set", "set", "delete", "duplicate", "line", "binary"]))
    if action == "line":
        lines[i] = draw(st.sampled_from(LINE_REPLACEMENTS))
    elif action == "binary":
        return "\n".join(lines[:i]).encode() + b"\n\x89PNG\r\n\x1a\n\xff\xfe\x00\n" + "\n".join(lines[i + 1 :]).encode()
    else:
        obj = json.loads(lines[i])
        target = obj["header"] if "header" in obj else obj  # a header's own fields
        key = draw(st.sampled_from(sorted(target) + ["unexpected"]))
        if action == "set":
            target[key] = draw(st.sampled_from(BAD_VALUES))
        elif action == "delete":
            target.pop(key, None)
        text = json.dumps(obj)  # NaN / Infinity as Python writes them
        if action == "duplicate" and key in target:
            text = text[:-1] + f", {json.dumps(key)}: {json.dumps(target[key])}}}"
        lines[i] = text
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=120, deadline=None, derandomize=True, database=None)  # the same cases on every run
@given(mutated_file())
def test_mutated_samples_give_one_error_or_a_finite_fit(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "samples.jsonl", Path(tmp) / "profile.json"
        path.write_bytes(data)
        res, elapsed = pearl_fit(path, out, "--json")
        assert elapsed < TIME_BOUND_S
        event(f"exit {res.exit_code}")  # --hypothesis-show-statistics: how many cases fit, how many are refused
        if res.exit_code == 0:
            assert_finite_fit(res, out)
        else:
            line = one_error_line(res)
            assert str(path) in line and "field '" in line, line

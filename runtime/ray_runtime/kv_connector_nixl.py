"""NixlConnector with the per-request loaded-tokens report (see `kv_connector`).

A module of its own because importing NIXL's native libraries into a process that later
loads OR-Tools aborts it: only engine processes configured for NIXL import this.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

from runtime.ray_runtime.kv_connector import LoadedTokensReport


class PearlNixlConnector(LoadedTokensReport, NixlConnector):
    """vLLM's NixlConnector; decode results carry `pearl_loaded_tokens`."""

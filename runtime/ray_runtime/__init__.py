"""The Ray runtime of `pearl train`: the planner in the loop over real or emulated engines.

Modules:
  controller      the online loop: ClusterState <- events, policy decisions, plans applied to actors
  rollout_worker  Ray actor holding the engines of its GPU slots (vLLM: one; emulated: many)
  engines         engine backends behind one interface: vLLM AsyncLLM | models.engine on the wall clock
  weight_sync     vLLM worker extension: in-place weight reload from safetensors bytes
  env_worker      the multi-turn calculator-tool task with a verifiable reward
  trainer         GRPO with clipped importance ratios (off-policy correction for stale trajectories)
  resources       GPU slots as Ray custom resources, fixed bindings, elastic availability (inline / trace)
  telemetry       runtime tracker (refits the predictor each step) and JSONL metrics

On GPU clusters the same code runs with the official vllm package: set
`runtime.kv_connector: NixlConnector` (engines start as kv_both; the prefill request carries
`do_remote_decode` and its returned kv_transfer_params go with the decode request), bind slots
to devices (`runtime.bindings`, `ray start --resources '{"pearl_gpu_<i>": 1}'` per node) and
connect with `pearl train --address`. The trainer's GPU path (FSDP2 across the training pool,
full state dict gathered for the weight blob) sits behind the same `Trainer.train_step`.
"""

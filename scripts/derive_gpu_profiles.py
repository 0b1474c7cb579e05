"""Write datasheet-derived engine profiles for GPUs we cannot run here (labelled 'derived').

Coefficients are inverse efficiencies typical of vLLM on Hopper/Ampere (prefill GEMMs ~55-60%
of peak, decode weight streaming ~80% of HBM bandwidth, per-step fixed cost of scheduling,
sampling and kernel launches). They stay 'derived' until `pearl profile` + `pearl fit`
replace them with measurements on that hardware.
"""

import json
import sys
from pathlib import Path

GPUS = ["H800", "H100", "H20", "A100"]
MODELS = {
    "qwen3-8b": dict(prefill=dict(fixed=0.004, compute=1.7, attn=2.2, weights=1.0, kv=1.0, comm=1.5),
                     decode=dict(fixed=0.006, compute=2.0, attn=2.5, weights=1.25, kv=1.4, comm=2.0)),
    # MoE: grouped-GEMM experts reach lower efficiency, more kernels per step.
    "qwen3-30b-a3b": dict(prefill=dict(fixed=0.006, compute=2.2, attn=2.2, weights=1.2, kv=1.0, comm=1.5),
                          decode=dict(fixed=0.009, compute=2.5, attn=2.5, weights=1.5, kv=1.4, comm=2.0)),
}


def main(out: str = "configs/profiles") -> None:
    for gpu in GPUS:
        for model, coeffs in MODELS.items():
            name = f"{gpu.lower()}-{model}"
            data = {"name": name, "hardware": gpu, "model": model, "label": "derived", "machine": "",
                    "notes": "datasheet-derived (scripts/derive_gpu_profiles.py); not yet measured on this GPU",
                    "coefficients": coeffs, "fit": {}}
            Path(out, f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])

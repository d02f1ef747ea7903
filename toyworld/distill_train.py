"""What the training stages of `toy distill` share (toyworld.distill_student: stages 3 and 5, the student;
toyworld.distill_decoder: stage 4, the light decoder): checkpoints of a parameter list and its moving average that
resume a killed stage, and the export of what they trained (the schedule and the step are toyworld.plumbing's, as
every training stage's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.adapters import light_decoder
from toyworld.distill_config import DistillConfig, final_stage

ADAPTER_FILE = "adapter.safetensors"
DECODER_FOLDER = "decoder"


# ---- export -------------------------------------------------------------------------------------------------------


def export(pipe, config: DistillConfig, finished: dict, out: Path) -> None:
    """The adapter in diffusers' LoRA layout (keys `transformer.<module>.lora_A.weight`, as Wan LoRAs are published)
    and the light decoder folder."""
    from diffusers import WanPipeline

    out.mkdir(parents=True, exist_ok=True)
    student = finished[final_stage(config)]
    WanPipeline.save_lora_weights(out, transformer_lora_layers=student["lora"], weight_name=ADAPTER_FILE,
                                  safe_serialization=True)
    decoder = light_decoder.LightDecoder(finished["decoder"]["decoder_config"])
    decoder.load_state_dict(finished["decoder"]["decoder"])
    light_decoder.save(decoder, out / DECODER_FOLDER)


# ---- plumbing -----------------------------------------------------------------------------------------------------


def checkpoint_params(path: Path, params, average, optimizer, schedule, step: int, seconds: float, cpu: float) -> None:
    state = {"params": [p.detach().clone() for p in params], "average": [a.clone() for a in average],
             "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "step": step, "seconds": seconds,
             "cpu_seconds": cpu}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def resume_params(path: Path, params, average, optimizer, schedule) -> tuple[int, float, float]:
    """The step, wall and CPU seconds a checkpoint reached (all 0 without one), its weights and optimizer loaded."""
    if not path.is_file():
        return 0, 0.0, 0.0
    state = torch.load(path, weights_only=False)
    with torch.no_grad():
        for p, saved in zip(params, state["params"]):
            p.copy_(saved)
        for a, saved in zip(average, state["average"]):
            a.copy_(saved)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    return state["step"], state["seconds"], state.get("cpu_seconds", 0.0)

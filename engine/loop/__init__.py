"""The denoising loop and its concerns: the loop (diffusers WanPipeline steps 4-6), guidance, the two experts,
what a batch is conditioned on (chunk ties, first frames, image inputs), stopping at a step, the stage clock."""

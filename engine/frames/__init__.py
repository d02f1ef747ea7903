"""Frames: latents decoded to frames, what a render refuses, the checks on every video, full-reference metrics,
pictures a video starts from, CLIP scores."""

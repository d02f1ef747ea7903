"""Long videos: a chain of same-shape chunks (the plan, each chunk's seed) and their latents stitched."""

"""Adapters a registration adds to a loaded pipeline: LoRA files in any layout diffusers reads, and a light VAE
decoder."""

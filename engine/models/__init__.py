"""Models: what a manifest may name (the registry and the built-in models with their weights), the operator's
models file and its keys, what a registration may add, a folder's family, and pipelines loaded once per process."""

"""The levers: the engine's one config object (every switch), the quality gates that release a lossy lever, lower
precision, the content keys gates are keyed by, faster equivalent operators, the text cache, pinned CPU kernels."""

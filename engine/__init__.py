from engine.levers import cpu_math

# Before anything in the engine touches torch's CPU kernels: the demo's bytes are then the same on any x86-64 CPU with
# AVX2, loaded or not (engine/levers/cpu_math.py).
cpu_math.pin()

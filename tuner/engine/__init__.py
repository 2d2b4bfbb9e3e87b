"""The stress engine: a nanochat-style training run that checks every step for miscomputation.

Runs only as a subprocess, `python -m tuner.engine ...`, and speaks JSON lines on stdout (docs/engine.md).
This is the only package in the project that imports torch; this `__init__` itself imports nothing, so the
torch-free modules (`options`, `patterns`, `events`, `protocol`) can be imported cheaply, by tests and by the
stress client. The protocol's version is `tuner.engine.events.PROTOCOL_VERSION`.
"""

"""undervolt-tuner: find the lowest stable GPU voltage setting with a training workload, and keep it."""

__version__ = "0.1.0"

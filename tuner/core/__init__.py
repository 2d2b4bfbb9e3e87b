"""Plain building blocks every layer shares: the domain model, typed errors and exit codes, paths, durations,
atomic writes and signal helpers. No textual, no torch, no hardware."""

"""The tuning core: the bisect plan and job, one trial, the journal and unsafe list, the kernel-log watcher,
the telemetry sampler, the engine client and the events they emit. No textual, no torch."""

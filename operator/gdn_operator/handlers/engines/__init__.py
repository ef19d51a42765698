"""The run-time watch of engine pods: crash watch, log following, quiet period, patch-set check, acceptance, stall detection, output probes."""

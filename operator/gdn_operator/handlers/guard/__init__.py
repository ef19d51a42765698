"""The GDNGuard path: the supervisor of guarded workloads, its admission webhook, owner lookup, guard status, and the one module through which it talks to the cluster."""

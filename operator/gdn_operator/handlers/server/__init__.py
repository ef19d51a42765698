"""The GDNModelServer path: the reconcile, the workload's status and rollout, the router, disruption budgets."""

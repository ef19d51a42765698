"""Pure rendering: GDNModelServer spec → vLLM argv and Kubernetes objects (entry point: render/objects.py's
`render_all`; floors: engine.py, the lowest builders, then lws / autoscale / router, then scaleout)."""

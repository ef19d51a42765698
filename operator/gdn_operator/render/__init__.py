from gdn_operator.render.engine import RenderError, render_all, vllm_args  # noqa: F401

"""hack/vllm-release-diff.py's parts: extract.py (a vLLM release -> the facts this repo depends on), report.py
(two extracts -> the changes, each with the parts of this repo that read it), watch.yaml (what is read, and by whom)."""

"""The engines a request runs on, one package each (transformers/, vllm/, tensorrt_llm/, remote/), what they share
(base.py: the face every backend has; processes.py: keeping an engine's server process; openai.py: the wire every
server speaks), the build store (store.py) and the one module that names them all (registry.py)."""

"""TensorRT-LLM: the backend in this process (backend.py), the worker in TensorRT-LLM's own environment (worker.py,
run by path), the backend that talks to it (worker_backend.py), the worker processes (processes.py) and the builds
and plans of both (builds.py)."""

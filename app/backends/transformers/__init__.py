"""The transformers backend: generation in this process with the app's own verify loop (backend.py), and its builds,
the prepared model cache with a trained artifact or a draft model (builds.py)."""

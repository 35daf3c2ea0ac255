"""A remote OpenAI-compatible server (backend.py) and the wire it speaks (openai.py)."""

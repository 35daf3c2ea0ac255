"""A remote OpenAI-compatible server (backend.py); the wire it speaks is app/backends/openai.py, which every engine's
client shares."""

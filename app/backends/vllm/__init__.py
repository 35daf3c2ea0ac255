"""vLLM: the backend (backend.py), the builds a server loads (builds.py), the server processes the service starts and
keeps (processes.py) and the client that talks to one, with its spec-decode counters (client.py)."""

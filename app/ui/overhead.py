"""`python -m app bench --ui-overhead`: what the web app costs on top of a plain generation.

The web app is launched in this process (loopback, a free port) on the same Service; each prompt
and mode then runs alternately through the service directly (what `python -m app generate` does)
and through the Run button's endpoint /run_controls with gradio_client (what a browser triggers: streamed
redraws of the step view and the charts), and the wall times are compared side by side.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Any

from app.service.api import Service
from app.ui import settings, web


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(service: Service, prompts: list[dict], modes: list[str], max_new_tokens: int, repeats: int = 2,
            progress=None) -> dict[str, Any]:
    from gradio_client import Client

    demo = web.Studio(service).blocks()
    demo.queue(max_size=service.limits.max_queue, default_concurrency_limit=service.limits.max_concurrency)
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=web.css(service))
    try:
        client = Client(f"http://127.0.0.1:{port}", verbose=False, download_files=False)
        rows = []
        for name in modes:
            mode, values = settings.mode_values(name, max_new_tokens=max_new_tokens)
            data = settings.to_request(mode, values)
            args = [None, mode, False] + [values[k] for k in settings.CONTROLS]  # /run_controls: prompt, mode, race, settings
            direct, ui = [], []
            for prompt in prompts:
                args[0] = prompt["text"]
                _direct(service, data, prompt["text"])  # warm-up of this prompt and mode
                for _ in range(repeats):  # alternate, so both paths see the same machine state
                    direct.append(_direct(service, data, prompt["text"]))
                    start = time.perf_counter()
                    client.predict(*args, api_name="/run_controls")
                    ui.append(time.perf_counter() - start)
            row = {"mode": name, "runs": len(direct), "direct_s": statistics.mean(direct), "ui_s": statistics.mean(ui)}
            row["overhead"] = row["ui_s"] / row["direct_s"] - 1
            rows.append(row)
            if progress:
                print(f"{mode:>16}: direct {row['direct_s']:.2f} s  ui {row['ui_s']:.2f} s  overhead {row['overhead']:+.1%}",
                      file=progress, flush=True)
        return {"max_new_tokens": max_new_tokens, "repeats": repeats, "rows": rows}
    finally:
        demo.close()


def _direct(service: Service, data: dict, prompt: str) -> float:
    start = time.perf_counter()
    for _ in service.stream(data, prompt):
        pass
    return time.perf_counter() - start


def format_table(result: dict) -> str:
    lines = [f"{'mode':<16}{'runs':>6}{'direct s':>10}{'web app s':>11}{'overhead':>10}"]
    for r in result["rows"]:
        lines.append(f"{r['mode']:<16}{r['runs']:>6}{r['direct_s']:>10.2f}{r['ui_s']:>11.2f}{r['overhead']:>+10.1%}")
    return "\n".join(lines)

"""Runs the TensorRT-LLM worker on the stand-in with its engine held after each request's first response, so that a
test in another process can abort a request, or go away, while it is still running; SIGUSR1 lets the engine go on.

    python tests/stand_ins/trtllm_hold.py WORKER.py --host ... --port ... --llm ...

The stand-in's own switch for this is tensorrt_llm.llm.HOLD ("Cleared by a test, the engine holds every response
after the first until it is set again"); a signal is how a test reaches it across processes.
"""

import runpy
import signal
import sys

from tensorrt_llm import llm

llm.HOLD.clear()
signal.signal(signal.SIGUSR1, lambda *_: llm.HOLD.set())
worker = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(worker, run_name="__main__")

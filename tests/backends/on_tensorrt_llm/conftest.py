"""Fixtures of the TensorRT-LLM tests: model directories the stand-in takes, and the workers a test started, killed
after it; the plain helpers are in tests/helpers_trtllm.py."""

import os
import signal

import pytest

from helpers_trtllm import Worker


@pytest.fixture
def model_dirs(tmp_path):
    # The stand-in, as upstream, takes an existing directory for a local model and anything else for a hub id.
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    return target, draft


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()

"""The GPU deployment files (deploy/gpu): no docker or GPU here, so what can be checked without them is: the files
parse, the one container runs the app with TensorRT-LLM's own environment beside it (the interpreter the app looks
for), the app's store is mounted so its artifacts reach the worker by path, and the UI is published on loopback only."""

import yaml

from app.backends.tensorrt_llm import processes as trtllm_processes
from app.backends.tensorrt_llm import backend as trt
from helpers import ROOT

GPU = ROOT / "deploy" / "gpu"


def test_the_compose_file_runs_the_app_which_starts_tensorrt_llm_in_its_own_environment():
    compose = yaml.safe_load((GPU / "compose.yaml").read_text())
    assert list(compose["services"]) == ["studio"], "one route: the app manages TensorRT-LLM's worker"
    studio = compose["services"]["studio"]
    assert studio["build"] == {"context": "../..", "dockerfile": "deploy/gpu/Dockerfile"}
    dockerfile = (GPU / "Dockerfile").read_text()
    assert f"FROM nvcr.io/nvidia/tensorrt-llm/release:{trt.VERSION}\n" in dockerfile, "the version the app is written against"
    # The interpreter whose presence makes the service run TensorRT-LLM in it (trtllm_processes.Settings' default).
    venv = trtllm_processes.VENV.relative_to(ROOT)
    assert f"python3 -m venv --system-site-packages {venv}" in dockerfile and "bash scripts/setup.sh" in dockerfile
    assert str(venv) in (ROOT / ".dockerignore").read_text().split(), "a host's own is not copied into the image"
    args = studio["command"]
    assert args[:4] == [".venv/bin/python", "-m", "app", "ui"] and "--backend" not in args
    workdir = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("WORKDIR "))
    mounted = {v.split(":")[1]: v.split(":")[0] for v in studio["volumes"]}
    assert mounted[f"{workdir}/engines"] == "../../engines", "the app's store, by the same path for the app and the worker"
    assert all(p.startswith("127.0.0.1:") for p in studio["ports"])
    assert studio["deploy"]["resources"]["reservations"]["devices"][0] == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}


def test_the_gpu_docs_describe_the_one_route_and_cite_nothing_outside_the_repository():
    assert not (ROOT / "Dockerfile.gpu").exists() and not (GPU / "trtllm-serve.yaml").exists()
    readme, doc = (ROOT / "README.md").read_text(), (ROOT / "docs" / "tensorrt-llm.md").read_text()
    assert "Dockerfile.gpu" not in readme and "docs/tensorrt-llm.md" in readme
    assert "deploy/gpu/compose.yaml" in doc and "could not be verified" in doc and "scripts/gpu-check.sh" in doc
    assert "pip install" not in doc, "TensorRT-LLM's pins would break the app's environment"
    for text in (readme, doc, (GPU / "compose.yaml").read_text(), (GPU / "Dockerfile").read_text()):
        assert not any(bad in text for bad in ("/work/", "TRTLLM.md", "ALGORITHMS.md", "shared/design"))


def test_the_space_keeps_its_store_on_persistent_storage_when_it_has_one(tmp_path):
    """A Space's disk is rebuilt at each restart: the container's entry keeps engines/ under the persistent mount
    (/data on a Space, given to scripts/space.sh by the Dockerfile) with the image's dequantized model linked in, so the
    fast pass built once serves every restart; without the mount it uses the image's engines/."""
    import subprocess

    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["sh", "scripts/space.sh", "/data", "--host", "0.0.0.0"' in dockerfile
    data = tmp_path / "data"
    data.mkdir()
    run = subprocess.run(["sh", "scripts/space.sh", str(data), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "--forwarded-allow-ips" in run.stdout, run.stderr  # the web app's flags
    store = data / "specdec-engines"
    assert (store / "models").is_symlink() and (store / "models").resolve() == (ROOT / "engines" / "models").resolve()
    assert f"persistent storage: {store}" in run.stderr
    bare = subprocess.run(["sh", "scripts/space.sh", str(tmp_path / "none"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0 and "persistent" not in bare.stderr and not (tmp_path / "none").exists()

"""The GPU deployment files (deploy/gpu): no docker or GPU here, so what can be checked without them is: the files
parse, the two services agree with each other (model name, port, config path), the UI is published on loopback
only, and the speculative config in trtllm-serve's YAML is what this app's own translation gives and what
TensorRT-LLM 1.2's config class accepts (the stand-in package, tests/stand_ins)."""

from pathlib import Path

import yaml

from app.modes import configs
from app.service.backends import tensorrt_llm as trt
from app.service.engines import spec_for, trtllm_plan
from helpers import trtllm_stand_in

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "deploy" / "gpu"


def test_the_compose_file_runs_the_ui_against_trtllm_serve():
    compose = yaml.safe_load((GPU / "compose.yaml").read_text())
    server, ui = compose["services"]["trtllm"], compose["services"]["ui"]
    version = trt.VERSION
    assert server["image"] == f"nvcr.io/nvidia/tensorrt-llm/release:${{TRTLLM_VERSION:-{version}}}", "the version the app pins"
    cmd = server["command"]
    assert cmd[0] == "trtllm-serve" and cmd[cmd.index("--backend") + 1] == "pytorch"
    mounted = {v.split(":")[1]: v.split(":")[0] for v in server["volumes"]}
    assert mounted[cmd[cmd.index("--extra_llm_api_options") + 1]] == "./trtllm-serve.yaml"
    assert "ports" not in server, "trtllm-serve is reached by the UI only"
    assert server["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    args = ui["command"]
    assert args[:5] == [".venv/bin/python", "-m", "app", "ui", "--backend"] and args[5] == "remote"
    assert args[args.index("--remote-url") + 1] == f"http://trtllm:{cmd[cmd.index('--port') + 1]}/v1"
    assert args[args.index("--model") + 1] == cmd[1], "the remote backend checks the server serves this model name"
    assert ui["build"] == {"context": "../..", "dockerfile": "Dockerfile"} and (GPU / "../../Dockerfile").resolve().is_file()
    assert all(p.startswith("127.0.0.1:") for p in ui["ports"])
    assert ui["depends_on"]["trtllm"]["condition"] == "service_healthy"


def test_the_trtllm_serve_yaml_is_this_apps_translation_and_upstream_accepts_it():
    options = yaml.safe_load((GPU / "trtllm-serve.yaml").read_text())
    spec = options["speculative_config"]
    request = configs.parse({"speculative_config": {"decoding_type": "Eagle", "speculative_model": spec["speculative_model"]},
                             "backend": "tensorrt_llm"})
    # What the plan sends the engine: on the PyTorch backend an EAGLE-3 checkpoint as `Eagle3` (upstream would convert
    # `Eagle` to it with a warning, TorchLlmArgs.validate_speculative_config).
    assert spec == trtllm_plan(spec_for(request, "meta-llama/Llama-3.1-8B-Instruct"))["llm"]["speculative_config"]
    assert spec["decoding_type"] == "Eagle3"
    assert options["enable_iter_perf_stats"] is True
    with trtllm_stand_in():
        from tensorrt_llm import llmapi

        made = llmapi.Eagle3DecodingConfig(**spec)
        assert (made.max_draft_len, made.num_eagle_layers, made.allow_advanced_sampling) == (5, 5, True)


def test_the_gpu_docs_replace_the_single_image_and_cite_nothing_outside_the_repository():
    assert not (ROOT / "Dockerfile.gpu").exists(), "one image cannot hold gradio 6 and TensorRT-LLM 1.2's pins"
    readme, doc = (ROOT / "README.md").read_text(), (ROOT / "docs" / "tensorrt-llm.md").read_text()
    assert "Dockerfile.gpu" not in readme and "docs/tensorrt-llm.md" in readme
    assert "deploy/gpu/compose.yaml" in doc and "could not be verified" in doc
    for text in (readme, doc, (GPU / "compose.yaml").read_text(), (GPU / "trtllm-serve.yaml").read_text()):
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

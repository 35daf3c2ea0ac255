# SpecDec Studio web app, CPU only (also the Hugging Face Space: sdk docker, app_port 7860).
#   docker build -t specdec-studio .
#   docker run --rm -p 7860:7860 specdec-studio        # then open http://localhost:7860
FROM python:3.11-slim

# torch from the CPU wheel index: requirements.txt pins torch==2.13.0, which there resolves to
# 2.13.0+cpu instead of the multi-GB CUDA build from PyPI. Override with --build-arg if needed.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    GRADIO_ANALYTICS_ENABLED=False

RUN useradd --create-home --uid 1000 app
WORKDIR /home/app/specdec-studio
COPY --chown=1000:1000 . .
USER 1000

RUN bash scripts/setup.sh \
    # dequantize the bundled model at build time, not on the first visit
    && .venv/bin/python -c "from app import models; models.locate(models.BUNDLED)"

EXPOSE 7860
# On a Hugging Face Space the platform sets SPACE_ID, which starts the app in public mode (README: Hosting publicly);
# elsewhere pass --public for anonymous visitors. Inside a container the app listens on all interfaces, to be reachable
# through -p / the Space's proxy. That proxy is on a private network and appends the address it saw to
# X-Forwarded-For, so a client is the rightmost address there that is not a private one (docs/ui.md: Hosting publicly).
# Not "*": with every hop trusted, uvicorn takes the leftmost entry, which the client writes itself. Run elsewhere with
# no proxy in front, a private peer's forged header would count: override the CMD without --forwarded-allow-ips.
# scripts/space.sh keeps engines/ on the Space's persistent storage when it has one (/data): the fast pass built on the
# first start then serves every restart.
CMD ["sh", "scripts/space.sh", "/data", "--host", "0.0.0.0", "--port", "7860", \
     "--forwarded-allow-ips", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16"]

# SpecDec Studio, CPU only. Build: docker build -t specdec-studio .   Run: docker run --rm specdec-studio
FROM python:3.11-slim

# torch from the CPU wheel index: requirements.txt pins torch==2.13.0, which there resolves to
# 2.13.0+cpu instead of the multi-GB CUDA build from PyPI. Override with --build-arg if needed.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

RUN useradd --create-home --uid 1000 app
WORKDIR /home/app/specdec-studio
COPY --chown=1000:1000 . .
USER 1000

RUN bash scripts/setup.sh

CMD ["bash", "scripts/start.sh"]

#!/usr/bin/env bash
# vLLM, as published, for the test of its own fused-MoE kernel (tests/test_vllm_moe_kernel.py):
# the wheel and the packages its fused-MoE module imports, without their dependencies (the
# project's environment has torch, Triton and the rest), into .vllm/ (git-ignored). The test runs
# the engine's kernel in a subprocess with .vllm/ on PYTHONPATH, in Triton's interpreter.
# About 560 MB to download, 1 GB on disk; done once (.vllm/.complete).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .vllm/.complete ] && exit 0
rm -rf .vllm
.venv/bin/pip install -q --no-deps --target .vllm vllm==0.33.0 \
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 cachetools==8.0.2 cbor2==6.3.0 \
  frozenlist==1.8.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface_hub==2.4.0 llguidance==1.9.1 \
  msgspec==0.22.0 multidict==7.2.1 openai==3.57.0 openai_harmony==0.0.8 \
  partial_json_parser==0.2.1.1.post7 propcache==0.5.4 py_cpuinfo==9.0.0 pybase64==1.5.1 \
  pyzmq==27.3.0 regex==2026.11.19 safetensors==0.8.0 sentencepiece==0.2.3 sniffio==1.3.1 \
  tokenizers==0.23.3 transformers==5.24.0 truststore==0.10.5 xgrammar==0.2.8 yarl==1.25.1
touch .vllm/.complete

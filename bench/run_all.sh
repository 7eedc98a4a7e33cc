#!/usr/bin/env bash
# Regenerates the CPU tables of bench/RESULTS.md (each script replaces only its own section).
#   bash bench/run_all.sh WORKDIR      # WORKDIR: a trained Multi30k workdir for decoding
# Needs: pip install -r requirements.txt -r bench/requirements.txt -e .
set -euo pipefail
cd "$(dirname "$0")/.."
workdir=${1:?usage: bash bench/run_all.sh TRAINED_WORKDIR}
python bench/train.py --config configs/small.py --batch 64 --length 24 --steps 20 \
  --markdown bench/RESULTS.md
python bench/train.py --config configs/base.py --batch 32 --length 32 --steps 8 \
  --vocab_size 37000 --variants jax-float32,jax-bfloat16,torch-float32,torch-bfloat16 \
  --markdown bench/RESULTS.md --section base
python bench/train.py --config configs/base.py --batch 64 --length 64 --steps 3 \
  --vocab_size 37000 --variants jax-bfloat16,jax-bfloat16-remat \
  --markdown bench/RESULTS.md --section remat
python bench/train.py --config configs/base.py --batch 32 --length 32 --steps 4 \
  --vocab_size 37000 --variants jax-float32 --profile --markdown bench/RESULTS.md --section profile
python bench/micro.py --markdown bench/RESULTS.md
python bench/decode.py --workdir "$workdir" --input ../shared/data/multi30k/test2016.en \
  --variants 'cached,cached (stop at K finished),cached (chunks of 8 steps),cached bfloat16,cached bfloat16 (stop at K finished),one loop per batch' \
  --ctranslate2 --markdown bench/RESULTS.md
python bench/latency.py --workdir "$workdir" --input ../shared/data/multi30k/test2016.en \
  --markdown bench/RESULTS.md

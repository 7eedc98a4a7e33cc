#!/usr/bin/env bash
# Regenerates every table of bench/RESULTS.md (each command replaces only its own section).
#   bash bench/run_all.sh WORKDIR      # WORKDIR: a trained Multi30k en-de workdir
# Needs: pip install -r requirements-dev.txt -r bench/requirements.txt -e . (torch for
# bench/train.py, transformers for bench/import_marian.py), ../shared/data/multi30k and
# ../shared/data/wmt14-newstest. The GPU section comes from bench/gpu.sh on a GPU instead.
# Run time: not measured for the whole script; its commands were run one at a time (2 cores):
# decode.py 6 min 21 s and import_marian.py 56 s (2026-12-07); the four serving runs 23, 15, 4
# and 21 minutes (2026-11-29); so at least 70 minutes. Nothing else should run meanwhile:
# every table compares figures measured minutes apart on the same cores.
set -euo pipefail
cd "$(dirname "$0")/.."
workdir=${1:?usage: bash bench/run_all.sh TRAINED_WORKDIR}
md=bench/RESULTS.md
m30k=../shared/data/multi30k
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Training: ours against torch.nn.Transformer
python bench/train.py --config configs/small.py --batch 64 --length 24 --steps 20 --markdown $md
python bench/train.py --config configs/base.py --batch 32 --length 32 --steps 8 \
  --vocab_size 37000 --variants jax-float32,jax-bfloat16,torch-float32,torch-bfloat16 \
  --markdown $md --section base
python bench/train.py --config configs/base.py --batch 64 --length 64 --steps 3 \
  --vocab_size 37000 --variants jax-bfloat16,jax-bfloat16-remat --markdown $md --section remat
python bench/train.py --config configs/base.py --batch 32 --length 32 --steps 4 \
  --vocab_size 37000 --variants jax-float32 --profile --markdown $md --section profile

# Decoding: ours against CTranslate2 float32 and int8, with BLEU, on test2016
python bench/decode.py --workdir "$workdir" --input $m30k/test2016.en \
  --reference $m30k/test2016.de --repeats 3 --markdown $md

# Time to the first translation, whole processes
python bench/latency.py --workdir "$workdir" --input $m30k/test2016.en \
  --precompiled_from $m30k/valid.en --markdown $md

# Serving: serve.py against the same server on CTranslate2 and without batching across
# requests, in rounds; one client; the soak with answers compared with decode.py's
python bench/serve.py --workdir "$workdir" --input $m30k/test2016.en \
  --servers ours,ctranslate2,ours_unbatched --clients 64 --rounds 5 --markdown $md \
  --section rounds
python bench/serve.py --workdir "$workdir" --input $m30k/test2016.en \
  --servers ours,ctranslate2 --clients 64 --rounds 3 --serve_flags '--beam_stop k_finished' \
  --markdown $md --section k_finished
python bench/serve.py --workdir "$workdir" --input $m30k/test2016.en \
  --servers ours,ctranslate2 --clients 1 --seconds 20 --markdown $md --section 'one client'
python decode.py --workdir "$workdir" --input $m30k/test2016.en --output "$scratch/ref.de" \
  --beam_size 4 --batch_invariant
python bench/serve.py --workdir "$workdir" --input $m30k/test2016.en \
  --reference "$scratch/ref.de" --servers ours --clients 64 --soak_seconds 300 \
  --serve_flags '--batch_invariant' --markdown $md --section soak

# Fault injection, the input pipeline, the Marian import
python bench/faults.py --rounds 20 --markdown $md
python bench/pipeline.py --train_steps 60 --markdown $md
python bench/import_marian.py --dir "$scratch/opus" --markdown $md

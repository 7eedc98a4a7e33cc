#!/usr/bin/env bash
# The GPU device run (bench/gpu.py), in two halves.
#
#   bash bench/gpu.sh prepare   # here, with the registry: the wheels the GPU image lacks go to
#                               # .whl/, Multi30k en-de to .gpu_data/ (both git-ignored)
#   bash bench/gpu.sh run       # on the GPU machine (device tool, carry [".whl", ".gpu_data"],
#                               # timeout_s 590): installs the wheels, links the data where the
#                               # configs look for it, runs bench/gpu.py --out $OUT
#
# The GPU image has Python 3.12, jax 0.11.2 (CUDA 13), flax, optax, orbax-checkpoint,
# sentencepiece, sacrebleu and torch, but no ml-collections, tensorboardX or ctranslate2, and
# no registry; ../shared does not travel.
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  grep -qx '/.gpu_data/' .git/info/exclude || echo '/.gpu_data/' >> .git/info/exclude
  rm -rf .whl && mkdir -p .whl .gpu_data/multi30k
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    ml-collections==1.1.0 tensorboardX==2.6.5 ctranslate2==4.8.5
  for f in train valid test2016 test2017; do
    cp ../shared/data/multi30k/$f.en ../shared/data/multi30k/$f.de .gpu_data/multi30k/
  done
  du -sh .whl .gpu_data
}

run() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD/src:$PWD" PYTHONUNBUFFERED=1
  if [ ! -e ../shared/data/multi30k ]; then  # where the configs read it from
    { mkdir -p ../shared/data && ln -s "$PWD/.gpu_data/multi30k" ../shared/data/multi30k; } ||
      echo "bench/gpu.sh: cannot link ../shared/data/multi30k; the recipe steps will fail" >&2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  python3 bench/gpu.py --out "${OUT:-/tmp/gpu_run}" "$@"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash bench/gpu.sh prepare|run [bench/gpu.py flags]" >&2; exit 2 ;;
esac

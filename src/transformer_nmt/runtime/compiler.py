"""What an engine's decoding programs run on this backend: the XLA options (decode.batch_invariant
turns off YNNPACK's reductions on a CPU; XLA_FLAGS read here, nowhere in decoding/) and the
decoding.Kernels (`kernels`: this runtime's on a CPU, with sums as halvings in programs
compiled so; the reference elsewhere)."""

from __future__ import annotations

import os

import jax

from transformer_nmt.decoding.kernels import REFERENCE, Kernels
from transformer_nmt.runtime import network

_YNN_FUSIONS = 'xla_cpu_experimental_ynn_fusion_type'


def compiler_options(batch_invariant: bool) -> dict[str, str]:
  """XLA options for the decoding programs (decode.batch_invariant). XLA's CPU backend hands
  reductions (LayerNorm's means, softmax denominators) to YNNPACK, which sums a row in an order
  that depends on how many rows the tensor has: the same sentence gets other last bits in
  another batch, and now and then its beam takes another path. XLA's own reductions sum
  every row alike. YNNPACK keeps the matmuls: their rows do not depend on the batch at beam
  search's row counts (rows x beam; not at 1 or 2 rows, which greedy batches can have).
  Nothing changes off CPUs, or when XLA_FLAGS chooses YNNPACK's fusions itself.

  The kernels of these programs are emitted by XLA's older CPU emitters
  (`xla_cpu_use_fusion_emitters` off): its newer ones load each kernel as an object of its
  own, three memory maps each, and a server's few hundred programs would pass the kernel's
  limit on maps per process (vm.max_map_count, 65530 by default) and crash while loading."""
  if (not batch_invariant or jax.default_backend() != 'cpu'
      or _YNN_FUSIONS in os.environ.get('XLA_FLAGS', '')):
    return {}
  return {_YNN_FUSIONS: 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT',
          'xla_cpu_use_fusion_emitters': 'False'}


def kernels(batch_invariant: bool) -> Kernels:
  """The decoder step and search reductions of the programs `compiler_options` gives: on a
  CPU this runtime's (network.py), with sums and maxima as halvings when those programs sum
  without YNNPACK (XLA's own reduction loops run slowly otherwise); the reference (model/)
  on other backends, for which no runtime of their own has been measured."""
  if jax.default_backend() != 'cpu':
    return REFERENCE
  return network.CPU_BATCH_INVARIANT if compiler_options(batch_invariant) else network.CPU

"""The host CPU's feature flags as Linux lists them in /proc/cpuinfo: the instructions XLA:CPU
code may use, which decide whether decoding computes faster in bfloat16 or in float32."""

from __future__ import annotations

import functools
from typing import Optional

# Instructions that multiply bfloat16 values: x86's AVX512-BF16 and AMX-BF16, Arm's BF16.
BFLOAT16_FLAGS = frozenset({'avx512_bf16', 'amx_bf16', 'bf16'})


@functools.cache
def flags_line() -> str:
  """The first CPU's feature line of /proc/cpuinfo ('flags' on x86, 'Features' on Arm), or ''
  where there is none (not Linux)."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      return next((line for line in f if line.startswith(('flags', 'Features'))), '')
  except OSError:
    return ''


def has_bfloat16() -> Optional[bool]:
  """Whether the CPU has bfloat16 arithmetic; None where /proc/cpuinfo does not say."""
  line = flags_line()
  if not line:
    return None
  return not BFLOAT16_FLAGS.isdisjoint(line.partition(':')[2].split())

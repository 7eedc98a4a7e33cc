"""Refusing a batch that cannot fit before anything is built: a batch of a billion tokens
would otherwise grow the process's memory until the machine gives out."""

from __future__ import annotations

import os
from typing import Optional, Sequence

import jax

from transformer_nmt.config import DataConfig
from transformer_nmt.errors import ConfigError

# The output layer's float32 logits and their gradient, per target token and vocabulary entry:
# the least any train step keeps for a batch, whatever the model's other activations.
LOGIT_BYTES = 8


def device_memory(devices: Optional[Sequence[jax.Device]] = None) -> tuple[int, str]:
  """Memory this process's devices can hold (bytes) and what it is: the accelerators' own
  (their allocator's limit), or the host's RAM for CPU devices, which share it."""
  devices = list(devices if devices is not None else jax.local_devices())
  if devices and devices[0].platform != 'cpu':
    limits = [(d.memory_stats() or {}).get('bytes_limit', 0) for d in devices]
    if all(limits):
      return sum(limits), f'{len(devices)} x {devices[0].device_kind}'
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'), "the host's RAM"


def check_batch_fits(data: DataConfig, processes: int = 1,
                     devices: Optional[Sequence[jax.Device]] = None) -> None:
  """Raises ConfigError, with the memory it would take, when this process's share of a batch
  of `data.tokens_per_batch` target tokens cannot hold even its logits (tokens x
  `data.vocab_size` x LOGIT_BYTES) in the memory of `devices`."""
  tokens = data.tokens_per_batch // max(processes, 1)
  needed = tokens * data.vocab_size * LOGIT_BYTES
  have, what = device_memory(devices)
  if needed > have:
    raise ConfigError(
        f'data.tokens_per_batch={data.tokens_per_batch} cannot fit: its logits alone take '
        f'{needed / 1e9:,.1f} GB ({tokens:,} target tokens x {data.vocab_size:,} vocabulary x '
        f'{LOGIT_BYTES} bytes), more than the {have / 1e9:,.1f} GB of {what}; lower it (and '
        'set train.global_batch_tokens to accumulate batches into a larger update)')

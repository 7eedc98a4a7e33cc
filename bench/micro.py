"""Microbenchmarks behind the decoding and loss optimisations in bench/RESULTS.md: each case
times the formulation the library used before against the one it uses now, side by side.

  python bench/micro.py [--cases attention,cross,cross_keys,topk,candidates,loss,dpa,dropout]

Times are medians of jitted calls (inputs not donated), in ms.
"""

import shlex
import sys
import time

import numpy as np
from absl import app, flags

_CASES = flags.DEFINE_list('cases', ['attention', 'cross', 'cross_keys', 'topk', 'candidates',
                                     'loss', 'dpa', 'dropout'],
                           'Which comparisons to run.')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/micro.py section.')
ROWS = []


def timed(fn, *args, repeats: int = 20) -> float:
  import jax
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times)) * 1e3


def report(case: str, before: str, t_before: float, after: str, t_after: float) -> None:
  ROWS.append(f'| {case} | {before}: {t_before:.2f} | {after}: {t_after:.2f} | '
              f'{t_before / t_after:.1f}x |')
  print(ROWS[-1], flush=True)


def attention() -> None:
  """One decoding query per row over a 32-position self-attention cache, 1024 rows."""
  import jax
  import jax.numpy as jnp

  from transformer_nmt.model.attention import KVCache
  n, length, h, d = 1024, 32, 4, 64
  q = jax.random.normal(jax.random.key(0), (n, 1, h, d))
  k, v = (jax.random.normal(jax.random.key(i), (n, length, h, d)) for i in (1, 2))

  def old(q, k, v):  # [N, L, H, Dh] cache, multiply-reduce over the minor axis
    probs = jax.nn.softmax(jnp.swapaxes(jnp.sum(q * k, -1), 1, 2), axis=-1)  # [N, H, L]
    return jnp.sum(jnp.swapaxes(probs, 1, 2)[..., None] * v, axis=1)

  cache = KVCache(jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), jnp.int32(length))
  new = lambda q, c: c.attend(c.attention_weights(q))  # noqa: E731
  report('one-query self-attention, 1024 rows x 32 positions', '[B, L, H, Dh] cache',
         timed(jax.jit(old), q, k, v), '[B, H, L, Dh] cache, dots', timed(jax.jit(new), q, cache))


def cross() -> None:
  """Beam 4's cross-attention: 256 sentences x 4 beams over 16 source positions."""
  import jax
  import jax.numpy as jnp

  from transformer_nmt.model.attention import apply_attention, attention_weights
  b, g, s, h, d = 256, 4, 16, 4, 64
  q = jax.random.normal(jax.random.key(0), (b * g, 1, h, d))
  k, v = (jax.random.normal(jax.random.key(i), (b, s, h, d)) for i in (1, 2))
  k = jnp.swapaxes(k, 1, 2)  # keys per head, as the decoder cache keeps them
  mask = jnp.ones((b, 1, 1, s), bool)
  attend = jax.jit(lambda q, k, v, mask: apply_attention(  # a decoding step's attention
      attention_weights(q, k, mask, one_query=True), v, one_query=True))
  tile = lambda x: jnp.repeat(x, g, axis=0)  # noqa: E731
  report('cross-attention, 256 sentences x 4 beams', 'K/V tiled per beam',
         timed(attend, q, tile(k), tile(v), tile(mask)), 'shared by the beams',
         timed(attend, q, k, v, mask))


def cross_keys() -> None:
  """A decoding step's cross-attention logits over 40 source positions in bfloat16: beam 4
  (192 sentences x 4 beams sharing their sentence's keys) and greedy (768 rows)."""
  import jax
  import jax.numpy as jnp
  from cross_keys import logits_before

  from transformer_nmt.model.one_step import one_query_logits

  for b, g in [(192, 4), (768, 1)]:
    s, h, d = 40, 4, 64
    q = jax.random.normal(jax.random.key(0), (b * g, 1, h, d)).astype(jnp.bfloat16)
    k = jax.random.normal(jax.random.key(1), (b, s, h, d)).astype(jnp.bfloat16)
    report(f'cross-attention logits, {b} sentences x {g} beams', 'keys [B, S, H, Dh], '
           'multiply-reduce', timed(jax.jit(logits_before), q, k),
           'keys per head [B, H, S, Dh], a matmul each',
           timed(jax.jit(one_query_logits), q, jnp.swapaxes(k, 1, 2)))


def topk() -> None:
  import jax
  import jax.numpy as jnp

  from transformer_nmt.decoding.topk import top_k
  for shape in [(1024, 8000), (1024, 37000)]:
    x = jax.random.normal(jax.random.key(0), shape)
    for k in (1, 8):
      report(f'top-{k} of {shape}', 'lax.top_k', timed(jax.jit(lambda x: jax.lax.top_k(x, k)), x),
             'topk.top_k', timed(jax.jit(lambda x: top_k(x, k)), x))
    report(f'argmax of {shape}', 'jnp.argmax', timed(jax.jit(lambda x: jnp.argmax(x, -1)), x),
           'topk.top_k(x, 1)', timed(jax.jit(lambda x: top_k(x, 1)), x))


def candidates() -> None:
  """Beam search's ranking of extensions: 256 sentences x 4 beams x 8000 tokens."""
  import jax
  import jax.numpy as jnp

  from transformer_nmt.decoding.beam import _candidates
  b, k, v = 256, 4, 8000
  logits = jax.random.normal(jax.random.key(0), (b * k, v))
  logprobs = jnp.zeros((b, k))

  def old(logits, logprobs):
    logp = jax.nn.log_softmax(logits).reshape(b, k, v)
    return jax.lax.top_k((logprobs[:, :, None] + logp).reshape(b, -1), 2 * k)

  def new(logits, logprobs):
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    cand, _ = _candidates(logits, lse, jnp.zeros((b * k,), bool), 2 * k, 2)
    return jax.lax.top_k((logprobs[:, :, None] + cand.reshape(b, k, -1)).reshape(b, -1), 2 * k)
  report('beam candidates, 256 x 4 beams x 8k vocabulary', 'log-softmax, top-k of K*V',
         timed(jax.jit(old), logits, logprobs), 'per-beam top-2K', timed(jax.jit(new), logits,
                                                                      logprobs))


def loss() -> None:
  """Label-smoothed loss, forward with metrics and gradient, logits [32, 32, 37000]."""
  import jax
  import jax.numpy as jnp

  from transformer_nmt.training.losses import smoothed_cross_entropy
  logits = jax.random.normal(jax.random.key(0), (32, 32, 37000)) * 3
  targets = jax.random.randint(jax.random.key(1), (32, 32), 0, 37000)
  weights = jnp.ones((32, 32))

  def old(logits, targets, weights, eps=0.1):
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss = (1 - eps) * nll - eps * jnp.mean(log_probs, axis=-1)
    correct = jnp.argmax(logits, axis=-1) == targets
    return {'loss': jnp.sum(loss * weights), 'nll': jnp.sum(nll * weights),
            'correct': jnp.sum(correct * weights), 'tokens': jnp.sum(weights)}
  for name, fn in [('forward with metrics', lambda f: f), ('gradient', lambda f: jax.grad(
      lambda x, t, w: f(x, t, w)['loss']))]:
    report(f'loss {name}, [32, 32, 37000]', 'log-softmax, gather, argmax',
           timed(jax.jit(fn(old)), logits, targets, weights, repeats=8), 'logsumexp, masked sum',
           timed(jax.jit(fn(smoothed_cross_entropy)), logits, targets, weights, repeats=8))


def dpa() -> None:
  """Our attention against jax.nn.dot_product_attention (XLA), forward and backward."""
  import jax
  import jax.numpy as jnp

  from transformer_nmt.model import attention
  for b, t, h, d, dtype in [(64, 24, 4, 64, 'float32'), (64, 24, 4, 64, 'bfloat16'),
                            (32, 32, 8, 64, 'float32')]:
    q, k, v = (jax.random.normal(jax.random.key(i), (b, t, h, d)).astype(dtype) for i in range(3))
    seg = (jnp.arange(t)[None] < jax.random.randint(jax.random.key(9), (b, 1), t // 2, t + 1))
    mask = attention.padding_mask(seg.astype(jnp.int32), seg.astype(jnp.int32))
    ours = lambda q, k, v: jnp.sum(  # noqa: E731
        attention.dot_product_attention(q, k, v, mask).astype(jnp.float32) ** 2)
    theirs = lambda q, k, v: jnp.sum(jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, mask=mask, implementation='xla').astype(jnp.float32) ** 2)
    grad = lambda f: jax.jit(jax.grad(f, argnums=(0, 1, 2)))  # noqa: E731
    report(f'attention forward+backward [{b}, {t}, {h}, {d}] {dtype}', 'jax.nn',
           timed(grad(theirs), q, k, v), 'ours', timed(grad(ours), q, k, v))


def dropout() -> None:
  """A dropout mask and its use on a [64, 24, 1024] bfloat16 activation (the one-hour Multi30k
  model's ReLU output), each of 10 masks from its own key, as in a training step."""
  import jax
  import jax.numpy as jnp

  from transformer_nmt.model.dropout import dropout as ours
  x = jax.random.normal(jax.random.key(0), (64, 24, 1024)).astype(jnp.bfloat16)

  def flax_like(rng, x, rate):  # nn.Dropout: a 32-bit float draw per element
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)

  def ten(fn):
    return jax.jit(lambda key, x: sum(fn(jax.random.fold_in(key, i), x, 0.1).astype(
        jnp.float32).sum() for i in range(10)))
  key = jax.random.key(1)
  report('10 dropout masks on [64, 24, 1024] bfloat16', 'jax.random.bernoulli',
         timed(ten(flax_like), key, x), '16-bit draws', timed(ten(ours), key, x))


def main(argv):
  del argv
  from transformer_nmt.results import machine
  for case in _CASES.value:
    globals()[case]()
  text = (f"{time.strftime('%Y-%m-%d')}, {machine()}. Command: `python bench/micro.py "
          f"{shlex.join(sys.argv[1:])}`\n\n| case | before (ms) | now (ms) | speed-up |\n"
          '| --- | --- | --- | ---: |\n' + '\n'.join(ROWS) + '\n')
  print(text)
  if _MARKDOWN.value:
    import pathlib

    from bench_markdown import write_section
    write_section(pathlib.Path(_MARKDOWN.value), 'bench/micro.py', text)


if __name__ == '__main__':
  app.run(main)

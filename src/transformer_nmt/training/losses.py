"""Label-smoothed cross-entropy (paper §5.4), returned as sums so that metrics aggregate exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def smoothed_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                           label_smoothing: float = 0.1) -> dict[str, jax.Array]:
  """Cross-entropy against (1 - eps) * one_hot + eps / V (Szegedy et al., as cited in §5.4).

  Padding is excluded through `weights`; divide the sums by `tokens` to normalise by real
  target tokens.

  Args:
    logits: [B, T, V] float32.
    targets: [B, T] int ids.
    weights: [B, T] 1.0 for real target tokens, 0.0 for padding.
    label_smoothing: eps_ls (0.1 in the paper).

  Returns:
    dict of scalars: 'loss' (smoothed CE sum), 'nll' (plain CE sum, for perplexity),
    'correct' (argmax hits; a target tied for the maximum counts), 'tokens' (sum of weights).
  """
  # From the logits directly, without materialising log-probabilities [B, T, V]: with
  # lse = logsumexp(logits), -log p(y) = lse - logit_y and the uniform term is lse - mean(logit).
  # The target's logit is a masked sum (its gradient is a fused select, not a scatter), and
  # `correct` compares it with the maximum instead of a slower argmax.
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  is_target = jnp.arange(logits.shape[-1]) == targets[..., None]  # [B, T, V]
  target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)  # [B, T]
  nll = lse - target_logit
  uniform = lse - jnp.mean(logits, axis=-1)  # CE against the uniform distribution, [B, T]
  loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  weights = weights.astype(jnp.float32)
  correct = (target_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)  # ties count as hits
  return {'loss': jnp.sum(loss * weights), 'nll': jnp.sum(nll * weights),
          'correct': jnp.sum(correct * weights), 'tokens': jnp.sum(weights)}

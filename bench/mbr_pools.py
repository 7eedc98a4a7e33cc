"""Minimum Bayes risk with other candidate and pseudo-reference pools, scored offline.

decode.mbr takes both pools from the beam: each of its K hypotheses is a candidate and a
pseudo-reference weighted by its renormalised model probability (decoding/mbr.py). This
script compares that with pools built from sampled translations (Eikema & Aziz 2020; Freitag
et al. 2023), each sample a pseudo-reference of weight 1/N, and prints corpus BLEU and chrF
of each choice against the references:

    python decode.py --workdir W --beam_size 8 --alpha 1.5 --format jsonl --n_best 8 \\
        --input valid.de --output nbest.jsonl
    python decode.py --workdir W --temperature 1.0 --seed S --input valid.de --output t1_S.txt
    python bench/mbr_pools.py --nbest nbest.jsonl --samples 't1_*.txt' --reference valid.en
"""

import argparse
import glob
import json
import os

import numpy as np
import sacrebleu

from transformer_nmt.config import MBR_UTILITIES
from transformer_nmt.decoding import mbr


def read_nbest(path: str) -> tuple[list[list[str]], list[np.ndarray]]:
  """Per line: the hypotheses' texts and their model weights (as decode.mbr weighs them)."""
  texts, weights = [], []
  with open(path, encoding='utf-8') as f:
    for line in f:
      hyps = json.loads(line)['hypotheses']
      texts.append([h['text'] for h in hyps])
      weights.append(mbr.model_weights([h['logprob'] for h in hyps]))
  return texts, weights


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--nbest', required=True, help='decode.py --format jsonl n-best list')
  p.add_argument('--samples', required=True, help='glob of sampled translation files')
  p.add_argument('--reference', required=True)
  p.add_argument('--utility', choices=MBR_UTILITIES, default='chrf')
  a = p.parse_args()
  files = sorted(glob.glob(a.samples))
  for path in [a.nbest, a.reference] + files:
    if not os.path.isfile(path):
      p.error(f'{path}: no such file')
  if not files:
    p.error(f'--samples {a.samples!r}: no file matches')
  beam, beam_w = read_nbest(a.nbest)
  samples = [open(f, encoding='utf-8').read().splitlines() for f in files]
  refs = open(a.reference, encoding='utf-8').read().splitlines()
  for path, lines in zip([a.nbest] + files, [beam] + samples):
    if len(lines) != len(refs):
      p.error(f'{path}: {len(lines)} lines, {a.reference} has {len(refs)}')
  n = len(samples)
  uniform = np.full(n, 1 / n)
  pools = {  # name: per line i, (candidates, pseudo-references, their weights)
      'beam / beam (decode.mbr)': lambda i: (beam[i], beam[i], beam_w[i]),
      f'beam / {n} samples': lambda i: (beam[i], [s[i] for s in samples], uniform),
      f'beam + samples / {n} samples': lambda i: (beam[i] + [s[i] for s in samples],
                                                  [s[i] for s in samples], uniform),
      f'beam / beam and {n} samples, half the weight each': lambda i: (
          beam[i], beam[i] + [s[i] for s in samples],
          np.concatenate([beam_w[i] / 2, uniform / 2])),
  }
  print(f'search best: BLEU {sacrebleu.corpus_bleu([b[0] for b in beam], [refs]).score:.2f}')
  for name, pool in pools.items():
    out = []
    for i in range(len(refs)):
      cands, pseudo, weights = pool(i)
      gains = mbr.utilities_against(cands, pseudo, weights, a.utility)
      out.append(cands[int(np.argmax(gains))])  # first of equals: the search's order
    print(f'{name} ({a.utility}): BLEU {sacrebleu.corpus_bleu(out, [refs]).score:.2f}, '
          f'chrF {sacrebleu.corpus_chrf(out, [refs]).score:.2f}', flush=True)


if __name__ == '__main__':
  main()

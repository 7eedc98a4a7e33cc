"""Decoding (§6.1): the cached search loop, greedy and beam search, dropping finished
sentences between chunks, top-k, and translating a workdir's model.
"""

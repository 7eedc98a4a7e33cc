"""Decoding (§6.1), pure functions of a model and a SearchSpec: the cached search loop,
greedy and beam search, dropping finished sentences between chunks, top-k, forced-decoding
scores, minimum Bayes risk. Serving a workdir's model is inference/'s.
"""

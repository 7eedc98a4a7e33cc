"""From text to batches: reading parallel files, the corpus a config names (text files,
tensorflow-datasets or the built-in demo), SentencePiece, and token-budget batching (§5.1).
"""

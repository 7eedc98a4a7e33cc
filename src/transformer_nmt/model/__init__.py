"""The Transformer of the paper (§3): attention (eq. 1, §3.2), embeddings, positions and the
feed-forward layer (§3.3-3.5), the encoder-decoder (Figure 1), and its bfloat16 matmuls.
"""

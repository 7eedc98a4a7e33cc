"""Training (§5): the label-smoothed loss, the eq. 3 schedule and Adam, the pure train and
eval steps, validation, and the loop that train.py runs.
"""

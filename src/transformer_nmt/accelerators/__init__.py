"""Programs for hardware this machine does not have: TPU and GPU programs compiled from shapes
(aot.py) and the GPU target configs they compile against (gpu_target.py)."""

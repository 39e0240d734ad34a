"""torch, for the parts of the package built on it (the torch.distributed
backend, the autograd functions, the block kernels, ring_flash_attn), or an
ImportError that says how to get it. The rest of the package (communicators,
data calls, plans) works without torch."""

try:
    import torch
except ImportError as e:
    raise ImportError(
        "this part of zeppelin needs PyTorch, and `import torch` failed (%s). In a virtual environment, make it "
        "with `python3 -m venv --system-site-packages ENV` to use the system's torch (Debian: apt-get install "
        "python3-torch), or install torch into it (`ENV/bin/pip install torch`, with network). Communicators, "
        "the data calls and plans work without torch." % e) from e

__all__ = ["torch"]

"""What a distributed run's parent and its workers share on the wire: arrays as JSON-able base64, and
the environment a worker reads its threads and timeout from. Kept apart so that neither side imports the other."""
from __future__ import annotations

import base64

import numpy as np

THREADS_ENV = "WORKBENCH_PARTITION_THREADS"
TIMEOUT_ENV = "WORKBENCH_PARTITION_TIMEOUT_S"


def encode_array(t) -> dict:
    """A float32 tensor or array as JSON-able base64 (what rank 0 sends the parent)."""
    a = np.ascontiguousarray(t.detach().numpy() if hasattr(t, "detach") else t, dtype=np.float32)
    return {"shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def decode_array(d: dict | None) -> np.ndarray | None:
    if d is None:
        return None
    return np.frombuffer(base64.b64decode(d["data"]), dtype=np.float32).reshape(d["shape"])

"""Type stubs for the native cached-attention kernel (built from workers/model/native/)."""

def attend(
    q: int, k_new: int, v_new: int, keys: int, values: int, out: int, start: int, counts: int, offsets: int,
    slots: int, heads: int, kv_heads: int, dim: int, max_len: int, ks0: int, ks1: int, ks2: int, vs0: int, vs1: int, vs2: int, scale: float,
    threads: int,
) -> None: ...
def use_openmp(library: str) -> bool: ...

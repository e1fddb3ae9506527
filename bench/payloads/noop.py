"""Launch-overhead worker: does nothing and exits 0 (no imports at all, certainly not torch)."""

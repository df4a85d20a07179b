import os

# Tests compile many small programs, in this process and in the subprocesses they start (which inherit
# the environment); compilation dominates their time. Set before JAX is imported:
# - a persistent compilation cache makes repeated compilations cheap;
# - the lowest backend optimization level, without fusion emitters, compiles about 2x faster (these
#   programs are tiny).
# - JAX on the CPU even where libtpu or the CUDA plugin is installed (the compile tests use them compile-only).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jax_cache")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

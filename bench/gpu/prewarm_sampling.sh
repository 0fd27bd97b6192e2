#!/bin/bash
# SGLang 0.5.17 builds FlashInfer's sampling kernels (nvcc) on the first top-k/top-p request: ~110 s on a fresh
# machine. Start that build on the CPU now (no GPU: CUDA hidden, the arch given), detached, while the first
# server starts; the server's own build then finds it (same arch dir, same lock).
#   prewarm_sampling.sh PYTHON LOG
PY=$1; LOG=$2
(CUDA_VISIBLE_DEVICES= FLASHINFER_CUDA_ARCH_LIST=9.0 setsid nohup "$PY" -c 'import time; t = time.time()
from flashinfer.jit.sampling import gen_sampling_module
spec = gen_sampling_module(); spec.build(verbose=False)
print("flashinfer sampling module built in", round(time.time() - t, 1), "s:", spec.jit_library_path, spec.is_compiled)' \
  > "$LOG" 2>&1 < /dev/null &)

#!/bin/bash
# SGLang's one-time builds on a GPU host (FlashInfer's JIT sampling and attention kernels, Triton's compiled
# kernels, CUDA's PTX cache), carried from one device session to the next: a fresh machine pays them again
# (the race's warm-up server: 160 s on the H100, 290 s on the H200), and they are the same for the same wheels
# and the same chip (sm_90 on both).
#   jit_cache.sh save OUTDIR   list what each cache holds (OUTDIR/jit-cache-du.txt), and archive them as
#                              OUTDIR/jit-cache.tgz where that stays under the 15 MiB a returned file may take
#   jit_cache.sh restore       unpack .gpu/jit/jit-cache.tgz (carried, from an earlier save) over / first
# Paths are kept absolute in the archive: the caches are found where the next run's SGLang looks for them.
mode=$1
DIRS=("$HOME/.cache/flashinfer" "$HOME/.triton/cache" "$HOME/.nv/ComputeCache" "$HOME/.cache/tvm-ffi"
      "$HOME/.cache/torch/kernels" "$HOME/.cache/deep_gemm")
LIMIT=${JIT_CACHE_LIMIT:-$((15 * 1024 * 1024))}
if [ "$mode" = save ]; then
  out=$2; mkdir -p "$out"
  du -s --block-size=1K "${DIRS[@]}" $HOME/.cache/* /tmp/torchinductor_* 2>/dev/null | sort -rn > "$out/jit-cache-du.txt"
  have=(); for d in "${DIRS[@]}"; do [ -d "$d" ] && have+=("${d#/}"); done
  [ ${#have[@]} -eq 0 ] && { echo "jit cache: none of ${DIRS[*]}"; exit 0; }
  tar czf /tmp/jit-cache.tgz -C / "${have[@]}"
  size=$(stat -c %s /tmp/jit-cache.tgz)
  if [ "$size" -le "$LIMIT" ]; then
    cp /tmp/jit-cache.tgz "$out/jit-cache.tgz"; echo "jit cache: $size bytes saved (${have[*]})"
  else
    echo "jit cache: $size bytes, over $LIMIT: not returned (sizes in jit-cache-du.txt)"
  fi
elif [ "$mode" = restore ]; then
  f=.gpu/jit/jit-cache.tgz
  if [ -f "$f" ]; then tar xzf "$f" -C / && echo "jit cache: restored $(stat -c %s "$f") bytes"; fi
else
  echo "usage: jit_cache.sh save OUTDIR | restore" >&2; exit 2
fi

#!/bin/bash
# Reassemble the uploaded payload into /tmp/site (idempotent). Run from the repo root on the GPU host.
# Parts: each run copies its uploaded .gpu/pNN/* to /tmp/parts first (/tmp survives between runs).
#        core.tar.zst.a? = tar of all other unpacked wheels (+ IPython stub), zstd --long=27, split;
#        fa.a? = sgl_kernel/flash_ops.abi3.so, zstd --long=27, split (pieces packed into p01..pNN)
set -e
S=/tmp/site
if [ -f $S/.ok ]; then echo "site already installed"; exit 0; fi
t0=$(date +%s)
mkdir -p $S
if command -v zstd >/dev/null; then
  unz() { zstd -d --long=27 -c; }
else
  mkdir -p /tmp/zs && python3 -m zipfile -e /tmp/parts/zstandard-*.whl /tmp/zs
  unz() { PYTHONPATH=/tmp/zs python3 -c "import sys,zstandard; zstandard.ZstdDecompressor(max_window_size=1<<27).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"; }
fi
cat /tmp/parts/core.tar.zst.?? | unz | tar -x -C $S
cat /tmp/parts/fa.?? | unz > $S/sgl_kernel/flash_ops.abi3.so
echo "$(cat /tmp/parts/flash_ops.sha256)  $S/sgl_kernel/flash_ops.abi3.so" | sha256sum -c
touch $S/.ok
echo "setup done in $(( $(date +%s) - t0 )) s; du: $(du -sh $S | cut -f1)"

#!/bin/bash
# On the GPU host, from the repo root: copy this run's uploaded payload part(s) to /tmp/parts.
# /tmp survives between runs only while the machine stays warm (~30 s after a run ends).
set -e
mkdir -p /tmp/parts
for d in .gpu/p0*; do
  [ -d "$d" ] && cp "$d"/* /tmp/parts/
done
ls -la /tmp/parts
bash bench/gpu/jit_cache.sh restore  # SGLang's one-time builds of an earlier session, where carried

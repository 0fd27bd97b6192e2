#!/bin/bash
# Build an SGLang 0.5.17 payload for an offline H200 host with torch 2.11 (run where pip works, in the repo root).
# Output: .gpu/p01 .. .gpu/pNN (5 today), each <= 55 MB (.gpu/ is git-ignored), to upload one part per run.
# zstd -7, not -19: -19 took ~50x longer on this 2-core machine for ~20% fewer bytes (one more part).
set -e
mkdir -p .git/info; grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
mkdir -p .gpu/dl && cd .gpu
PF="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
 --platform manylinux1_x86_64 --platform any"
python3 -m pip download -q --no-deps $PF -d dl \
  sglang==0.5.17 sglang-kernel==0.4.5 flashinfer_python==0.6.15.post1 xgrammar==0.2.1 apache-tvm-ffi==0.1.11 \
  transformers==5.12.1 tokenizers==0.22.2 \
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2 \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  openai==2.6.1 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 \
  orjson==3.13.0 msgspec==0.23.0 pybase64==1.5.1 partial-json-parser==0.2.1.1.post7 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
  setproctitle==1.3.8 pyzmq==27.3.0 zstandard==0.25.0 dill==0.4.1 python-multipart==0.0.34 interegular==0.3.3 \
  compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 \
  specforge==0.2.0
rm -rf site big p0* && mkdir -p site big
for w in dl/*.whl; do unzip -q -o "$w" -d site; done
# prune: Blackwell ops, xgrammar static lib; FA3 (flash_ops, 1.1 GB) is compressed separately
rm -rf site/sgl_kernel/sm100 site/xgrammar/lib/libxgrammar.a
mv site/sgl_kernel/flash_ops.abi3.so big/
# sglang.utils imports IPython.display at module level: ship a 2-file stand-in instead of IPython
mkdir -p site/IPython && echo "# stand-in for IPython (sglang.utils imports IPython.display)" > site/IPython/__init__.py
printf 'class HTML:\n    def __init__(self, data=None, *a, **k):\n        self.data = data\ndef display(*objs, **kw):\n    for o in objs:\n        print(getattr(o, "data", o))\n' > site/IPython/display.py
tar -C site -cf - . | zstd -7 --long=27 -T2 -q -o big/core.tar.zst
zstd -7 --long=27 -T2 -q big/flash_ops.abi3.so -o big/flash_ops.so.zst        # ~171 MB
# pieces of <= 9 MB packed in order into parts of <= 55 MB, so that a part plus the working tree
# stays well under the 64 MiB a call carries
split -b 9000000 -a 2 big/flash_ops.so.zst big/fa.
split -b 9000000 -a 2 big/core.tar.zst big/core.tar.zst.
n=1; used=0; mkdir -p p01
for f in big/fa.* big/core.tar.zst.?? dl/zstandard-*.whl; do   # zstandard: fallback if the host lacks zstd
  size=$(stat -c %s "$f")
  if [ $((used + size)) -gt 55000000 ]; then n=$((n + 1)); used=0; mkdir -p "$(printf p%02d $n)"; fi
  cp "$f" "$(printf p%02d $n)/"; used=$((used + size))
done
sha256sum big/flash_ops.abi3.so | cut -d' ' -f1 > "$(printf p%02d $n)/flash_ops.sha256"
du -sh p0*

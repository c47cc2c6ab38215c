#!/usr/bin/env bash
# Download, on this CPU machine, the cp312 manylinux x86_64 wheels that the GPU machine's image
# lacks, into gpu-wheels/ (git-ignored), for scripts/gpu_run.sh to install there with no network.
#
#   scripts/fetch_gpu_wheels.sh            # core set (~17 MiB): what the image lacks + transformers
#   scripts/fetch_gpu_wheels.sh --full     # also the deps the image already has (~30 MiB)
#   scripts/fetch_gpu_wheels.sh --list     # print the pins and exit (no network)
#   DEST=dir PY_VERSION=3.12 scripts/fetch_gpu_wheels.sh
#
# Why these (docs/GPU_RUN.md has the details):
# - The H200 image (Python 3.12, torch 2.11) has no pydantic: memcalc's specs are pydantic 2 models.
#   pydantic 2.14.4 needs pydantic-core==2.50.5 (binary), annotated-types, typing-inspection and
#   typing-extensions>=4.16.0 (the image's version is not recorded, so it travels too).
# - transformers: the image has 5.17.0; the engine's HF programs were written and checked on CPU
#   against 5.24.0 (the .venv's), so 5.24.0 travels to measure the same modeling code. Its runtime
#   version check needs regex>=2025.10.22 (the image's regex version is not recorded: it travels);
#   the image's huggingface-hub 1.33.0, tokenizers 0.23.2 and safetensors 0.8.0 satisfy the rest
#   (checked here in an image-like venv). transformers never pulls torch: --no-deps.
# - --full adds the pure/abi3 deps the image already has (sympy, mpmath, tqdm, nvidia-ml-py,
#   tokenizers, safetensors, huggingface-hub, pyyaml, packaging, filelock), pinned to versions
#   that work with transformers 5.24.0 and torch 2.11, for an image that lost one of them.
# Exactly one version of each package is kept (two stop the install there): DEST's wheels are
# replaced on every run.
set -euo pipefail
cd "$(dirname "$0")/.."

CORE=(
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  transformers==5.24.0
  regex==2026.11.19
)
EXTRA=(
  sympy==1.14.0
  mpmath==1.3.0
  tqdm==4.70.1
  nvidia-ml-py==13.615.71
  tokenizers==0.23.3
  safetensors==0.8.0
  huggingface-hub==1.33.0
  pyyaml==6.0.4
  packaging==26.4
  filelock==4.3.1
)

DEST=${DEST:-gpu-wheels}
PY_VERSION=${PY_VERSION:-3.12}
full=0
list=0
for arg in "$@"; do
  case "$arg" in
    --full) full=1 ;;
    --list) list=1 ;;
    -h|--help) sed -n 2,27p "$0"; exit 0 ;;
    *) echo "fetch_gpu_wheels: unknown argument $arg; fix: use --full, --list or --help" >&2; exit 2 ;;
  esac
done
pins=("${CORE[@]}")
[ "$full" = 1 ] && pins+=("${EXTRA[@]}")
if [ "$list" = 1 ]; then
  printf '%s\n' "${pins[@]}"
  exit 0
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The platform tags the device README lists; pip matches manylinux_2_N exactly, so several.
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
timeout 600 "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp "${platforms[@]}" -d "$tmp" "${pins[@]}"

mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST"/MANIFEST.txt
mv "$tmp"/*.whl "$DEST"/

count=$(ls "$DEST"/*.whl | wc -l)
if [ "$count" -ne "${#pins[@]}" ]; then
  echo "fetch_gpu_wheels: expected ${#pins[@]} wheels, got $count" >&2
  exit 1
fi
{
  echo "# wheels for the GPU machine (Python $PY_VERSION, manylinux x86_64), $(date -u +%FT%TZ)"
  echo "# bytes  sha256  file"
  for w in "$DEST"/*.whl; do
    printf '%s  %s  %s\n' "$(stat -c %s "$w")" "$(sha256sum "$w" | cut -c1-16)" "$(basename "$w")"
  done
  total=$(cat "$DEST"/*.whl | wc -c)
  echo "# total $total bytes ($(( total / 1048576 )) MiB) in $count wheels"
} > "$DEST/MANIFEST.txt"
cat "$DEST/MANIFEST.txt"
total=$(cat "$DEST"/*.whl | wc -c)
if [ "$total" -gt $(( 40 * 1048576 )) ]; then
  echo "fetch_gpu_wheels: warning: $(( total / 1048576 )) MiB is over the 40 MiB aim (carry limit 64 MiB with the repo)" >&2
fi

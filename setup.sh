#!/usr/bin/env bash
# One-command set-up from a fresh clone: .venv/ with the pinned SGLang, the project, its patch set and the
# embedded model. Idempotent (a stamp skips the installs when nothing they depend on changed) and loud on
# failure. Only package registries are used.
#
#   ./setup.sh            # CUDA if `nvidia-smi` sees a GPU, else the CPU path
#   SETUP_FORCE=1 ./setup.sh   # reinstall even if the stamp matches
set -euo pipefail
cd "$(dirname "$0")"
trap 'echo "setup.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

PYTHON=${PYTHON:-python3}
SGLANG_VERSION=0.5.20
TORCH_VERSION=2.13.0
NIXL_VERSION=1.5.1
# What sglang needs at run time on the CPU path (its full dependency list pulls CUDA-only packages and a
# multi-GB CUDA torch; see ../shared/docs/sglang-on-cpu.md). openai-harmony (sglang's own pin): without it SGLang
# leaves /v1/responses unset up, and the route answered every request with a 500.
CPU_RUNTIME_DEPS=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pyzmq tqdm ipython
  pydantic aiohttp transformers==5.12.1 tokenizers==0.22.2 dill compressed-tensors==0.18.0 gguf openai==2.6.1
  openai-harmony==0.0.4 partial-json-parser apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 uvicorn uvloop fastapi
  setproctitle einops jsonschema soundfile==0.13.1 python-multipart xxhash pyyaml prometheus-client)

log() { printf 'setup.sh: %s\n' "$*"; }
start=$(date +%s)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  MODE=cuda
  CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -1)
  NIXL_PKG=$([ "${CUDA_MAJOR:-12}" -ge 13 ] && echo nixl-cu13 || echo nixl-cu12)
else
  MODE=cpu
  NIXL_PKG=nixl-cu12
fi
log "mode: $MODE"

[ -x .venv/bin/python ] || { log "creating .venv"; "$PYTHON" -m venv .venv; }
PY=.venv/bin/python
PIP=(.venv/bin/pip install --disable-pip-version-check --progress-bar off)
DEV_DEPS=$("$PY" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies']['dev']))")
# sglang-router (cache-aware routing in front of replicas), pinned in pyproject.toml's `router` extra
ROUTER_DEPS=$("$PY" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies']['router']))")

stamp_file=.venv/.sglang_ext-setup-stamp
stamp=$( { echo "$MODE"; cat setup.sh pyproject.toml; } | sha256sum | cut -c1-16)
if [ "${SETUP_FORCE:-0}" != 1 ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  log "packages already installed for this set-up (stamp $stamp)"
else
  constraints=.venv/constraints.txt
  echo "torch==$TORCH_VERSION" > "$constraints"
  log "installing torch==$TORCH_VERSION"
  "${PIP[@]}" "torch==$TORCH_VERSION"
  if [ "$MODE" = cuda ]; then
    log "installing sglang==$SGLANG_VERSION with its own dependencies"
    "${PIP[@]}" -c "$constraints" "sglang==$SGLANG_VERSION" "$NIXL_PKG==$NIXL_VERSION" $DEV_DEPS $ROUTER_DEPS
  else
    log "installing sglang==$SGLANG_VERSION (no CUDA dependencies) and its CPU runtime dependencies"
    "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION" xgrammar==0.2.1
    "${PIP[@]}" -c "$constraints" "${CPU_RUNTIME_DEPS[@]}" "$NIXL_PKG==$NIXL_VERSION" $DEV_DEPS $ROUTER_DEPS
  fi
  log "installing this project (editable: registers the sglang.srt.plugins entry point)"
  "${PIP[@]}" --no-deps --no-build-isolation -e .
  echo "$stamp" > "$stamp_file"
fi

site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
standins="$site/sglang_ext_cpu_standins.pth"
if [ "$MODE" = cpu ]; then
  echo "$PWD/sglang_ext/cpu_standins" > "$standins"   # triton / torchvision / sgl_kernel stand-ins
else
  rm -f "$standins"
fi

log "applying the patch set"
"$PY" -m sglang_ext.patches apply

log "checking imports"
SGLANG_USE_CPU_ENGINE=$([ "$MODE" = cpu ] && echo 1 || echo 0) "$PY" -W ignore -c "
import importlib, sglang
assert sglang.__version__ == '$SGLANG_VERSION', sglang.__version__
importlib.import_module('${NIXL_PKG//-/_}._api')
from sglang_ext.plugin import register; register()
" > .venv/setup-import-check.log 2>&1 || { cat .venv/setup-import-check.log >&2; exit 1; }

# promtool (Prometheus' rule test tool) for tests/monitoring's alert-rule test, from the OS package registry when
# missing; optional: without it that one test skips and says why
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
     { apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 ||
       { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; }; }; then
    log "installed promtool (apt package prometheus)"
  else
    log "promtool not installed (apt package prometheus); the alert-rule test will skip"
  fi
fi

log "embedded model: $("$PY" -m sglang_ext.embedded_model)"
log "done in $(( $(date +%s) - start )) s; venv $(du -sh .venv | cut -f1)"

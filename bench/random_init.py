"""Writes a random-init HF checkpoint (bf16, seed 0) of a config.

    python3 bench/random_init.py CONFIG_DIR OUT_DIR

The device scripts use it for models whose weights the repo does not ship
(examples/models/* hold config.json only).
"""
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

cfg = AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).save_pretrained(sys.argv[2], safe_serialization=True)
print("ok")

#!/usr/bin/env python3
"""Fine-tunes a Hugging Face model folder on a JSONL file of conversations,
prompt/completion pairs or texts; only the assistant's turns (completions)
are learnt. The result is a folder transformers loads.

    python3 examples/python/finetune.py MODEL_DIR train.jsonl OUT_DIR [STEPS]"""
import os
import sys

import megatrain

folder, jsonl, out = sys.argv[1:4]
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 200
os.makedirs(out, exist_ok=True)
data_file = os.path.join(out, "train.mt")
print(megatrain.prepare(jsonl, data_file, tokenizer=folder))  # tokens, and the loss mask

with megatrain.Model.from_pretrained(folder) as model, \
        megatrain.Dataset(data_file, seq_len=256, format="docs", heldout_fraction=0.05) as data:
    megatrain.train(model, data, max_steps=steps, micro_batch_size=8, lr=2e-5, warmup_steps=steps // 10,
                    eval_steps=max(steps // 4, 1), output_dir=os.path.join(out, "checkpoints"), resume=True)
    model.save(out)
print(f"saved {out}")

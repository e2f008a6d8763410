#!/usr/bin/env python3
"""Trains a small model on a repeating token pattern through the megatrain
package: the same run as examples/c/train.c, printing the same lines after
the first (`make check` compares them).

    python3 examples/python/train.py

Exits 0 when the loss fell to under half its first value."""
import sys

import numpy as np

import megatrain

N_SEQ, SEQ_LEN, STEPS = 4, 32, 60

print(f"libmegatrain {megatrain.library_version} from Python")
shape = dict(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, precision="fp32")

# a refusal first: 7 query heads, which the default 8 key/value heads do not divide
try:
    megatrain.Model(num_attention_heads=7, backend="cpu").close()
    sys.exit("a bad config was not refused")
except megatrain.InvalidArgumentError as e:
    print(f"refused as expected: {e}")

with megatrain.Model(**shape, backend="cpu") as model:
    print(f"{model.num_params} parameters")
    # 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it
    pattern = np.array([3, 17, 5, 29, 11, 2, 23], dtype=np.int32)
    at = np.arange(N_SEQ)[:, None] + np.arange(SEQ_LEN)[None, :]
    tokens, targets = pattern[at % 7], pattern[(at + 1) % 7]
    optim = megatrain.OptimConfig(lr=3e-3, total_steps=STEPS)

    losses = []
    for i in range(STEPS):
        stats = model.step(tokens, targets, optim=optim)
        losses.append(stats.loss)
        if i % 20 == 0 or i == STEPS - 1:
            print(f"step {stats.step:2d}: loss {stats.loss:.6f}, grad norm {stats.grad_norm:.6f}, lr {stats.lr:.6f}")

if not losses[-1] < 0.5 * losses[0]:
    sys.exit(f"the loss did not fall to half: {losses[0]:.4f} -> {losses[-1]:.4f}")
print(f"learned: loss {losses[0]:.6f} -> {losses[-1]:.6f}")

//! Trains a small model on a repeating token pattern through the megatrain
//! crate: examples/c/train.c call for call, printing the same lines after
//! the first.
//!
//!     cargo run --example train
//!
//! Exits 0 when the loss fell to under half its first value.
use megatrain::{Backend, Batch, Model, ModelConfig, OffloadPolicy, OptimConfig, Precision};
use std::process::exit;

const N_SEQ: usize = 4;
const SEQ_LEN: usize = 32;
const STEPS: u32 = 60;

fn main() {
    println!("libmegatrain {} from Rust", megatrain::version());

    let cfg = ModelConfig {
        vocab_size: 32,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 64,
        precision: Precision::FP32,
        ..Default::default()
    };
    let pol = OffloadPolicy {
        backend: Backend::CPU,
        ..Default::default()
    };

    // a refusal first: 7 query heads, which the default 8 key/value heads do not divide
    let bad = ModelConfig {
        num_attention_heads: 7,
        ..Default::default()
    };
    match Model::new(&bad, &pol) {
        Err(e) if !e.message.is_empty() => println!("refused as expected: {e}"),
        Err(e) => {
            eprintln!(
                "a bad config was not refused with a message ({:?})",
                e.status
            );
            exit(1);
        }
        Ok(_) => {
            eprintln!("a bad config was not refused with a message (MT_OK)");
            exit(1);
        }
    }

    let mut model = Model::new(&cfg, &pol).unwrap_or_else(|e| {
        eprintln!("mt_model_create: {e}");
        exit(1)
    });
    println!("{} parameters", model.num_params());

    // 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it
    let pattern = [3, 17, 5, 29, 11, 2, 23];
    let mut tokens = vec![0; N_SEQ * SEQ_LEN];
    let mut targets = vec![0; N_SEQ * SEQ_LEN];
    for s in 0..N_SEQ {
        for t in 0..SEQ_LEN {
            tokens[s * SEQ_LEN + t] = pattern[(s + t) % 7];
            targets[s * SEQ_LEN + t] = pattern[(s + t + 1) % 7];
        }
    }
    let batch = Batch::new(&tokens, &targets, N_SEQ as u32, SEQ_LEN as u32);
    let opt = OptimConfig {
        lr: 3e-3,
        total_steps: STEPS,
        ..Default::default()
    };

    let (mut first, mut last) = (0.0, 0.0);
    for i in 0..STEPS {
        let stats = model.step(&batch, &opt).unwrap_or_else(|e| {
            eprintln!("mt_step: {e}");
            exit(1)
        });
        if i == 0 {
            first = stats.loss;
        }
        last = stats.loss;
        if i % 20 == 0 || i == STEPS - 1 {
            println!(
                "step {:2}: loss {:.6}, grad norm {:.6}, lr {:.6}",
                stats.step, stats.loss, stats.grad_norm, stats.lr as f64
            );
        }
    }
    drop(model);
    let learned = last < 0.5 * first; // false for a NaN loss too
    if !learned {
        eprintln!("the loss did not fall to half: {first:.4} -> {last:.4}");
        exit(1);
    }
    println!("learned: loss {first:.6} -> {last:.6}");
}

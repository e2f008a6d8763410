use super::*;
use std::path::PathBuf;
use std::sync::Mutex;

/// The model of examples/c/train.c: small enough to train in a test.
fn tiny() -> ModelConfig {
    ModelConfig {
        vocab_size: 32,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 64,
        precision: Precision::FP32,
        ..Default::default()
    }
}

fn cpu() -> OffloadPolicy {
    OffloadPolicy {
        backend: Backend::CPU,
        ..Default::default()
    }
}

/// 4 sequences of 32 tokens of a period-7 pattern: (tokens, targets).
fn pattern() -> (Vec<i32>, Vec<i32>) {
    let p = [3, 17, 5, 29, 11, 2, 23];
    let tokens = (0..4 * 32).map(|i| p[(i / 32 + i % 32) % 7]).collect();
    let targets = (0..4 * 32).map(|i| p[(i / 32 + i % 32 + 1) % 7]).collect();
    (tokens, targets)
}

/// A fresh folder under the system's temporary one, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("megatrain-rs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn version_is_this_major() {
    assert_eq!(version_number() / 10000, sys::MT_VERSION_MAJOR);
    assert!(version().starts_with("0."));
}

#[test]
fn create_step_eval() {
    let mut model = Model::new(&tiny(), &cpu()).unwrap();
    assert_eq!(model.backend(), Backend::CPU);
    assert!(model.num_params() > 0);
    assert_eq!(model.step_count(), 0);
    // head_dim 0 comes back resolved: 64 / 4
    assert_eq!(
        model.config().unwrap(),
        ModelConfig {
            head_dim: 16,
            ..tiny()
        }
    );

    let (tokens, targets) = pattern();
    let batch = Batch::new(&tokens, &targets, 4, 32);
    let before = model.eval(&batch).unwrap();
    assert!(before.loss.is_finite() && before.loss > 0.0);
    assert_eq!(before.target_tokens, 128);
    let opt = OptimConfig {
        lr: 3e-3,
        total_steps: 10,
        ..Default::default()
    };
    let mut last = StepStats::default();
    for i in 1..=10 {
        last = model.step(&batch, &opt).unwrap();
        assert_eq!(last.step, i);
    }
    assert_eq!(model.step_count(), 10);
    assert!(last.loss.is_finite() && last.grad_norm > 0.0);
    let after = model.eval(&batch).unwrap();
    assert!(
        after.loss < before.loss,
        "{} -> {}",
        before.loss,
        after.loss
    );
    assert_eq!(model.step_count(), 10, "eval must not step");

    let logits = model.logits(&tokens[..64], 2, 32).unwrap();
    assert_eq!(logits.len(), 2 * 32);
    assert!(logits.iter().all(|x| x.is_finite()));
}

/// The device list reaches the library (it reads it during the call): one
/// listed twice is refused by name, before any GPU is looked for.
#[test]
fn device_list_is_passed_and_checked() {
    let pol = OffloadPolicy {
        backend: Backend::CUDA,
        devices: vec![1, 0, 1],
        ..Default::default()
    };
    let err = Model::new(&ModelConfig::default(), &pol).unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    assert!(
        err.message
            .contains("lists device 1 twice (entries 0 and 2)"),
        "{}",
        err.message
    );
}

/// The weight fetch reaches the library: a value it does not know is
/// refused by name; the default is AUTO.
#[test]
fn weight_fetch_is_passed_and_checked() {
    assert_eq!(OffloadPolicy::default().weight_fetch, WeightFetch::AUTO);
    let pol = OffloadPolicy {
        backend: Backend::CUDA,
        devices: vec![0, 1],
        weight_fetch: WeightFetch(3),
        ..Default::default()
    };
    let err = Model::new(&ModelConfig::default(), &pol).unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    assert!(
        err.message
            .contains("weight_fetch 3 is not an mt_weight_fetch"),
        "{}",
        err.message
    );
}

#[test]
fn refused_config_has_status_and_message() {
    // 7 query heads, which the default 8 key/value heads do not divide
    let bad = ModelConfig {
        num_attention_heads: 7,
        ..Default::default()
    };
    let err = Model::new(&bad, &cpu()).unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    assert!(!err.message.is_empty());
    assert_eq!(
        err.to_string(),
        format!(
            "{}: {}",
            Status::INVALID_ARGUMENT.description(),
            err.message
        )
    );
    // usable as a boxed error
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
    assert!(boxed.to_string().contains(": "));
}

#[test]
fn out_of_range_token_refused() {
    let mut model = Model::new(&tiny(), &cpu()).unwrap();
    let (mut tokens, targets) = pattern();
    tokens[40] = 32; // vocab_size is 32
    let err = model
        .step(
            &Batch::new(&tokens, &targets, 4, 32),
            &OptimConfig::default(),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    assert!(!err.message.is_empty());
    assert_eq!(model.step_count(), 0, "a refused step changes nothing");
    tokens[40] = -1;
    let err = model.logits(&tokens[32..64], 1, 32).unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
}

#[test]
fn batch_lengths_checked_before_the_call() {
    let mut model = Model::new(&tiny(), &cpu()).unwrap();
    let (tokens, targets) = pattern();
    let short = Batch::new(&tokens[..100], &targets[..100], 4, 32);
    let err = model.step(&short, &OptimConfig::default()).unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    let err = model
        .eval(&Batch::new(&tokens, &targets[..127], 4, 32))
        .unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    assert_eq!(
        model.logits(&tokens, 1, 32).unwrap_err().status,
        Status::INVALID_ARGUMENT
    );
}

#[test]
fn dataset_open_missing_file() {
    let path =
        std::env::temp_dir().join(format!("megatrain-rs-{}-missing.bin", std::process::id()));
    let err = Dataset::open(&path, &DatasetOptions::default()).unwrap_err();
    assert_eq!(err.status, Status::IO);
    assert!(err.message.contains("missing.bin"), "{}", err.message);
}

#[test]
fn dataset_read() {
    let dir = Scratch::new("dataset");
    let path = dir.0.join("tokens.u16");
    let ids: Vec<u16> = (0..1000).map(|i| (i * 7 % 31) as u16).collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    let opts = DatasetOptions {
        format: TokenFormat::U16,
        vocab_size: 32,
        seq_len: 16,
        heldout_fraction: 0.1,
        ..Default::default()
    };
    let ds = Dataset::open(&path, &opts).unwrap();
    assert_eq!(ds.num_tokens(), 1000);
    let (train, held) = (ds.num_windows(Split::TRAIN), ds.num_windows(Split::HELDOUT));
    assert!(train > 0 && held > 0);
    let (tokens, targets) = ds.read(Split::HELDOUT, 0, 3).unwrap();
    assert_eq!(tokens.len(), 48);
    // targets are the next token of the file
    for s in 0..3 {
        assert_eq!(
            tokens[s * 16 + 1..s * 16 + 16],
            targets[s * 16..s * 16 + 15]
        );
    }
    // shared by threads
    let ds = Arc::new(ds);
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let ds = Arc::clone(&ds);
            std::thread::spawn(move || ds.read(Split::TRAIN, i, 2).unwrap())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap().0.len(), 32);
    }
    let mut odd = vec![0; 20];
    let err = ds
        .read_into(Split::TRAIN, 0, &mut odd, &mut [0; 20])
        .unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
}

#[test]
fn abort_flag_stops_a_step() {
    let flag = Arc::new(AtomicBool::new(false));
    let policy = OffloadPolicy {
        abort: Some(Arc::clone(&flag)),
        ..cpu()
    };
    let mut model = Model::new(&tiny(), &policy).unwrap();
    drop(policy); // the model keeps the flag alive
    let (tokens, targets) = pattern();
    let batch = Batch::new(&tokens, &targets, 4, 32);
    let opt = OptimConfig::default();
    model.step(&batch, &opt).unwrap();
    let before = model.logits(&tokens[..32], 1, 32).unwrap();

    flag.store(true, Ordering::Relaxed);
    let err = model.step(&batch, &opt).unwrap_err();
    assert_eq!(err.status, Status::ABORTED, "{err}");
    assert!(!err.message.is_empty());
    assert_eq!(model.eval(&batch).unwrap_err().status, Status::ABORTED);
    assert_eq!(model.step_count(), 1, "an aborted step changes nothing");

    flag.store(false, Ordering::Relaxed);
    assert_eq!(model.logits(&tokens[..32], 1, 32).unwrap(), before);
    assert_eq!(model.step(&batch, &opt).unwrap().step, 2);
}

#[test]
fn log_callback_receives_lines() {
    let lines = Arc::new(Mutex::new(Vec::<(LogLevel, String)>::new()));
    let sink = Arc::clone(&lines);
    let policy = OffloadPolicy {
        log_level: LogLevel::INFO,
        log: Some(Arc::new(move |level: LogLevel, text: &str| {
            sink.lock().unwrap().push((level, text.to_string()))
        })),
        ..cpu()
    };
    let model = Model::new(&tiny(), &policy).unwrap();
    // the model may be moved to, and used from, another thread
    let params = std::thread::spawn(move || model.num_params())
        .join()
        .unwrap();
    assert!(params > 0);
    let lines = lines.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|(l, t)| *l == LogLevel::INFO && t.contains("CPU")),
        "{lines:?}"
    );
}

#[test]
fn plan_matches_model() {
    let shape = BatchShape {
        micro_batch_size: 4,
        seq_len: 32,
        num_micro_batches: 1,
    };
    let p = plan(&tiny(), &cpu(), Some(&shape)).unwrap();
    assert_eq!(p.backend, Backend::CPU);
    assert_eq!(p.num_units, 2 + 2);
    let persistent = plan(&tiny(), &cpu(), None).unwrap();
    let model = Model::new(&tiny(), &cpu()).unwrap();
    assert_eq!(p.num_params, model.num_params());
    assert_eq!(persistent.num_params, model.num_params());

    let tight = OffloadPolicy {
        host_budget_bytes: 4096,
        ..cpu()
    };
    let err = plan(&tiny(), &tight, Some(&shape)).unwrap_err();
    assert_eq!(err.status, Status::HOST_BUDGET);
    assert!(!err.message.is_empty());
}

#[test]
fn lr_schedule() {
    let opt = OptimConfig {
        warmup_steps: 10,
        ..Default::default()
    };
    assert!((opt.lr_at(9) - opt.lr).abs() < 1e-9);
    assert!(opt.lr_at(0) < opt.lr);
    let bad = OptimConfig { lr: -1.0, ..opt };
    assert!(bad.lr_at(0).is_nan());
}

#[test]
fn timeline_needs_cuda() {
    let mut model = Model::new(&tiny(), &cpu()).unwrap();
    let (tokens, targets) = pattern();
    model
        .step(
            &Batch::new(&tokens, &targets, 4, 32),
            &OptimConfig::default(),
        )
        .unwrap();
    let err = model.timeline(8).unwrap_err();
    assert_eq!(err.status, Status::UNSUPPORTED);
}

#[test]
fn save_load_and_checkpoints() {
    let dir = Scratch::new("checkpoints");
    let (tokens, targets) = pattern();
    let batch = Batch::new(&tokens, &targets, 4, 32);
    let opt = OptimConfig::default();
    let mut a = Model::new(&tiny(), &cpu()).unwrap();
    a.step(&batch, &opt).unwrap();
    a.step(&batch, &opt).unwrap();
    let info = CheckpointInfo {
        data_position: 5,
        rng_state: [1, 2, 3, 4],
        caller_json: Some(r#"{"run":{"lr":0.003}}"#.to_string()),
        ..Default::default()
    };
    a.checkpoint_save(dir.0.join("ckpt"), &info).unwrap();
    a.save(dir.0.join("hf")).unwrap();

    let other_seed = ModelConfig { seed: 2, ..tiny() };
    let mut b = Model::new(&other_seed, &cpu()).unwrap();
    let got = b.checkpoint_load(dir.0.join("ckpt")).unwrap();
    assert_eq!(
        (got.step, got.data_position, got.rng_state),
        (2, 5, [1, 2, 3, 4])
    );
    assert_eq!(got.caller_json.as_deref(), Some(r#"{"run":{"lr":0.003}}"#));
    assert_eq!(b.step_count(), 2);
    // a resumed step is the step the original takes
    assert_eq!(
        a.step(&batch, &opt).unwrap().loss,
        b.step(&batch, &opt).unwrap().loss
    );

    let mut c = Model::new(&other_seed, &cpu()).unwrap();
    c.load(dir.0.join("hf")).unwrap();
    let mut cfg = ModelConfig {
        precision: Precision::FP32,
        ..Default::default()
    };
    cfg.read_hf_config(dir.0.join("hf")).unwrap();
    assert_eq!(cfg.hidden_size, 64);
    assert_eq!(cfg.num_key_value_heads, 2);

    let err = c.load(dir.0.join("nothing-here")).unwrap_err();
    assert_ne!(err.status, Status::OK);
    assert!(!err.message.is_empty());
    let err = c.checkpoint_load(dir.0.join("nothing-here")).unwrap_err();
    assert!(!err.message.is_empty());
    let err = c.save("with\0nul").unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
}

#[test]
fn status_debug_and_display() {
    assert_eq!(format!("{:?}", Status::ABORTED), "Status::ABORTED");
    assert_eq!(format!("{:?}", Status(99)), "Status(99)");
    assert_eq!(Status::ABORTED.to_string(), "aborted by the caller");
}

#[test]
fn doc_writer_round_trip() {
    let dir = Scratch::new("docs");
    let path = dir.0.join("train.mt");
    let mut w = DocWriter::create(&path, 100).unwrap();
    w.append(&[1, 2, 3], false).unwrap(); // a prompt
    w.append(&[4, 5, 6, 7], true).unwrap();
    w.end_document().unwrap();
    w.append_flags(&[8, 9, 10], &[1, 1, 0]).unwrap();
    let err = w.append(&[100], true).unwrap_err();
    assert_eq!(err.status, Status::INVALID_ARGUMENT);
    assert!(
        err.message.contains("outside the vocabulary"),
        "{}",
        err.message
    );
    assert_eq!(
        (w.num_tokens(), w.num_targets(), w.num_documents()),
        (10, 6, 1)
    );
    assert!(!path.exists(), "the file is under its name before finish");
    w.finish().unwrap();
    let opts = DatasetOptions {
        format: TokenFormat::DOCS,
        vocab_size: 100,
        seq_len: 8,
        heldout_fraction: 0.0,
        ..DatasetOptions::default()
    };
    let ds = Dataset::open(&path, &opts).unwrap();
    assert_eq!(ds.num_tokens(), 10);
    assert_eq!(ds.num_windows(Split::TRAIN), 2);

    // abandoned: nothing under the name, no temporary
    let gone = dir.0.join("gone.mt");
    let mut w = DocWriter::create(&gone, 100).unwrap();
    w.append(&[1, 2], true).unwrap();
    drop(w);
    assert!(!gone.exists() && !dir.0.join("gone.mt.tmp").exists());
    let err = DocWriter::create(dir.0.join("nope/x.mt"), 100).unwrap_err();
    assert_eq!(err.status, Status::IO);
    assert!(err.message.contains("does not exist"), "{}", err.message);
}

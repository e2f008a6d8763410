//! The declarations against the loaded library: its version, and the
//! initialisers that take this crate's struct sizes.
use megatrain_sys::*;
use std::ffi::CStr;
use std::mem::size_of;

#[test]
fn version() {
    // SAFETY: the version functions take nothing and return static data.
    let (number, text) = unsafe { (mt_version_number(), CStr::from_ptr(mt_version_string())) };
    assert_eq!(number / 10000, MT_VERSION_MAJOR, "another major version");
    assert!(
        number >= MT_VERSION_NUMBER,
        "a library older than these declarations"
    );
    let want = format!("{}.{}.{}", number / 10000, number / 100 % 100, number % 100);
    assert_eq!(text.to_str().unwrap(), want);
}

#[test]
fn init_sets_size_and_defaults() {
    let cfg = mt_model_config::init();
    assert_eq!(cfg.struct_size as usize, size_of::<mt_model_config>());
    assert_eq!(cfg.vocab_size, 32000);
    assert_eq!(cfg.precision, MT_PRECISION_BF16);
    let pol = mt_offload_policy::init();
    assert_eq!(pol.struct_size as usize, size_of::<mt_offload_policy>());
    assert_eq!(pol.weight_slots, 2);
    assert_eq!(pol.numa_node, -1);
    assert!(pol.log_callback.is_none() && pol.abort_callback.is_none());
    assert_eq!(
        mt_timeline::init().struct_size as usize,
        size_of::<mt_timeline>()
    );
    assert_eq!(mt_dataset_options::init().seq_len, 1024);

    let mut shape = mt_batch_shape::init();
    shape.seq_len = 7;
    // SAFETY: shape is a valid mt_batch_shape.
    unsafe { mt_batch_shape_init(&mut shape) };
    assert_eq!((shape.struct_size, shape.seq_len), (16, 1024));
}

#[test]
fn status_strings() {
    for st in MT_OK..=MT_ERR_INTERNAL {
        // SAFETY: mt_status_str returns a static string for any value.
        let s = unsafe { CStr::from_ptr(mt_status_str(st)) };
        assert!(!s.to_bytes().is_empty());
    }
}

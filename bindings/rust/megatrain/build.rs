//! Lets this package's own tests and examples find libmegatrain at run time
//! without LD_LIBRARY_PATH: an rpath to the libdir that megatrain-sys got
//! from pkg-config (DEP_MEGATRAIN_LIBDIR, from its `links` key). link-arg
//! reaches only this package's tests, examples and binaries, never a
//! program that depends on the crate.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_MEGATRAIN_LIBDIR");
    if std::env::var_os("CARGO_CFG_UNIX").is_none() {
        return;
    }
    if let Some(dir) = std::env::var_os("DEP_MEGATRAIN_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
}

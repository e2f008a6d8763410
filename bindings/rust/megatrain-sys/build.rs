//! Finds libmegatrain with pkg-config and links it (dynamically unless
//! pkg-config's usual variables ask for static linking).

fn main() {
    // The declarations in src/lib.rs are those of 0.2: an older library lacks some.
    let lib = match pkg_config::Config::new()
        .atleast_version("0.2")
        .probe("megatrain")
    {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!(
                "megatrain-sys: libmegatrain >= 0.2 was not found by pkg-config.\n\
                 Install it and point PKG_CONFIG_PATH at the folder that holds megatrain.pc,\n\
                 e.g. PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig for `make install PREFIX=$PREFIX`.\n\
                 pkg-config said: {e}"
            );
            std::process::exit(1);
        }
    };
    // Dependents' build scripts get these as DEP_MEGATRAIN_LIBDIR and
    // DEP_MEGATRAIN_INCLUDE (the `links` key).
    if let Some(dir) = lib.link_paths.first() {
        println!("cargo:libdir={}", dir.display());
        // This crate's own tests find the library without LD_LIBRARY_PATH;
        // link-arg reaches only this package's tests, never a dependent.
        if std::env::var_os("CARGO_CFG_UNIX").is_some() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
    if let Some(dir) = lib.include_paths.first() {
        println!("cargo:include={}", dir.display());
    }
}

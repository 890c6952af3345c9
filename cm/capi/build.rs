//! Generates `ibcm.h` from the FFI modules with cbindgen, into `OUT_DIR`. The committed copy
//! (`include/ibcm.h`, what the install step installs) is compared with it by the test
//! `header_is_current` (`IBCM_CAPI_BLESS=1 cargo test -p ibcm-capi header` rewrites it).

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let sources = [
        "src/ffi/types.rs",
        "src/ffi/ctx.rs",
        "src/ffi/api.rs",
        "src/ffi/conn.rs",
        "src/ffi/apm.rs",
        "src/ffi/xrc.rs",
        "src/ffi/data.rs",
    ];
    for s in sources.iter().chain(&["cbindgen.toml"]) {
        println!("cargo:rerun-if-changed={s}");
    }
    let config = match cbindgen::Config::from_file(dir.join("cbindgen.toml")) {
        Ok(c) => c,
        Err(e) => {
            println!("cargo:warning=cbindgen.toml: {e}");
            std::process::exit(1);
        }
    };
    let mut b = cbindgen::Builder::new().with_config(config);
    for s in sources {
        b = b.with_src(dir.join(s));
    }
    match b.generate() {
        Ok(h) => {
            h.write_to_file(out.join("ibcm.h"));
        }
        Err(e) => {
            println!("cargo:warning=generating ibcm.h: {e}");
            std::process::exit(1);
        }
    }
    // The shared library's soname, so that programs record libibcm.so.0.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibcm.so.0");
}

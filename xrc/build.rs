//! Build script: with feature `rdma`, compile `csrc/shim.c` (the C shim around libibverbs'
//! static inline XRC verbs, called from `src/verbs/ffi.rs`) and `csrc/rc.c` (its RC part:
//! CQs, memory regions, RC QPs, posting and polling; `src/verbs/rc/sys.rs`), and link
//! libibverbs. Without the feature it does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "rdma")]
    rdma::build();
}

#[cfg(feature = "rdma")]
mod rdma {
    use std::process::Command;

    /// Flags from `pkg-config PKG ARGS`, or `None` when pkg-config or the package is missing.
    fn pkg_config(args: &[&str]) -> Option<Vec<String>> {
        let out = Command::new("pkg-config").args(args).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8(out.stdout).ok()?;
        Some(text.split_whitespace().map(str::to_owned).collect())
    }

    /// Whether the libibverbs development header can be found: pkg-config's include dirs,
    /// else the system include dir.
    fn have_verbs_header(cflags: Option<&[String]>) -> bool {
        let mut dirs: Vec<std::path::PathBuf> = cflags
            .unwrap_or_default()
            .iter()
            .filter_map(|f| f.strip_prefix("-I").map(Into::into))
            .collect();
        dirs.push("/usr/include".into());
        dirs.iter().any(|d| d.join("infiniband/verbs.h").exists())
    }

    pub(super) fn build() {
        println!("cargo:rerun-if-changed=csrc/shim.c");
        println!("cargo:rerun-if-changed=csrc/rc.c");
        let cflags_probe = pkg_config(&["--cflags", "libibverbs"]);
        if !have_verbs_header(cflags_probe.as_deref()) {
            // A clear stop instead of the C compiler's "infiniband/verbs.h: No such file".
            eprintln!(
                "ibcm-xrc: feature `rdma` needs the rdma-core development files \
                 (infiniband/verbs.h): apt-get install libibverbs-dev pkg-config \
                 (tests/run installs them); without them, build without `--features rdma` \
                 / `--all-features`"
            );
            std::process::exit(1);
        }
        let mut cc = cc::Build::new();
        cc.file("csrc/shim.c")
            .file("csrc/rc.c")
            .warnings(true)
            .extra_warnings(true);
        if let Some(cflags) = pkg_config(&["--cflags", "libibverbs"]) {
            for f in cflags {
                if let Some(dir) = f.strip_prefix("-I") {
                    cc.include(dir);
                } else {
                    cc.flag(&f);
                }
            }
        }
        cc.compile("ibcm_xrc_shim");
        match pkg_config(&["--libs", "libibverbs"]) {
            Some(libs) => {
                for f in libs {
                    if let Some(dir) = f.strip_prefix("-L") {
                        println!("cargo:rustc-link-search=native={dir}");
                    } else if let Some(lib) = f.strip_prefix("-l") {
                        println!("cargo:rustc-link-lib={lib}");
                    }
                }
            }
            // No pkg-config metadata: fall back to the plain library name.
            None => println!("cargo:rustc-link-lib=ibverbs"),
        }
    }
}

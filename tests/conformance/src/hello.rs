// hello.rs -- proves that a normal host `rustc`/cargo build (x86_64-unknown-linux-gnu,
// dynamically linked against glibc) runs in the guest.
use std::fs;
fn main() {
    let rel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let umad = fs::metadata("/dev/infiniband/umad0").is_ok();
    println!("HELLO-RS ok kernel={} umad0={}", rel.trim(), umad);
}

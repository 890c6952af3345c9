//! Each TGT QP ownership policy played out through ibcm, as a timeline.
//!
//! ```text
//! cargo run -p ibcm-xrc --example xrc_policies            # simulator, then UDP on loopback
//! cargo run -p ibcm-xrc --example xrc_policies -- --sim   # simulator only
//! ```
//!
//! A target node T runs P = 3 processes (t1, t2, t3) sharing **one TGT QP per remote node**;
//! Q = 2 remote nodes (A, B) connect to every process through ibcm — on the deterministic
//! simulator and over RoCEv2/UDP on loopback — and per policy the events of the crate-doc
//! matrix happen: process exits, initiator disconnects, an owner destroying the QP, the
//! domain closing, the keeper crashing. The timeline shows who did what, which DREQs and
//! REJs crossed the wire, and what each initiator concluded ("target gone" vs "refused").
//! The scenarios live in `demo.rs`, which `tests/example.rs` also runs.

mod demo;

use std::process::ExitCode;

fn main() -> ExitCode {
    let which = if std::env::args().any(|a| a == "--sim") {
        demo::Transports::Sim
    } else {
        demo::Transports::Both
    };
    println!("XRC TGT QP ownership policies through ibcm");
    println!(
        "target node T: processes t1 t2 t3 (one XRC SRQ and one CM service each) in domain job42;"
    );
    println!("remote nodes A, B: one INI QP each, one XRC connection to every target process\n");
    let r = demo::run(which, |p| {
        println!("{}", demo::heading(p));
        print!("{}", p.text);
        println!("{}\n", demo::summary(p));
    });
    match r {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xrc_policies: {e}");
            ExitCode::FAILURE
        }
    }
}

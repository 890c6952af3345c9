//! `xrc-probe`: what the rdma-core backend says about a device's XRC support.
//!
//! ```text
//! xrc-probe [--device NAME] [--force] [--exercise] [--file PATH]
//! ```
//!
//! * Prints the device, its `device_cap_flags` and whether `IBV_DEVICE_XRC` is set, then opens
//!   the device through [`RdmaVerbs::open`], which refuses a device without XRC with the typed
//!   error "device NAME has no XRC".
//! * `--force` also calls `ibv_open_xrcd` regardless of the flag and prints what the provider
//!   answers (rxe: EOPNOTSUPP).
//! * `--exercise` (XRC devices): private and file-shared domains, a TGT QP, a second handle on it
//!   by number, an XRC SRQ and its number, an INI QP, TGT RESET→INIT, then everything destroyed.
//!
//! The last stdout line is `RESULT xrc-ok|no-xrc|no-device|error …`; the exit status is 0, 2,
//! 3 or 1 respectively. The conformance lab runs it on rxe (tests/conformance, run `xrc-rxe`).

use std::process::ExitCode;

use ibcm_xrc::verbs::model::IBV_DEVICE_XRC;
use ibcm_xrc::verbs::qp::{AccessFlags, QpAttr};
use ibcm_xrc::{
    DomainSpec, IniQp, IniQpCaps, QpState, RdmaVerbs, SrqAttr, Verbs, VerbsError, XrcSrq,
};

struct Opts {
    device: Option<String>,
    force: bool,
    exercise: bool,
    file: String,
}

fn usage() -> ExitCode {
    eprintln!("usage: xrc-probe [--device NAME] [--force] [--exercise] [--file PATH]");
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut o = Opts {
        device: None,
        force: false,
        exercise: false,
        file: "/tmp/xrc-probe.xrcd".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => match args.next() {
                Some(d) => o.device = Some(d),
                None => return usage(),
            },
            "--file" => match args.next() {
                Some(f) => o.file = f,
                None => return usage(),
            },
            "--force" => o.force = true,
            "--exercise" => o.exercise = true,
            "-h" | "--help" => {
                println!("xrc-probe [--device NAME] [--force] [--exercise] [--file PATH]");
                return ExitCode::SUCCESS;
            }
            _ => return usage(),
        }
    }
    probe(&o)
}

fn result(code: u8, text: &str) -> ExitCode {
    println!("RESULT {text}");
    ExitCode::from(code)
}

fn probe(o: &Opts) -> ExitCode {
    let mut raw = match RdmaVerbs::open_unchecked(o.device.as_deref()) {
        Ok(v) => v,
        Err(VerbsError::NoDevice) => {
            eprintln!("xrc-probe: {}", VerbsError::NoDevice);
            return result(3, "no-device");
        }
        Err(e) => {
            eprintln!("xrc-probe: {e}");
            return result(1, "error");
        }
    };
    let info = raw.device();
    println!(
        "device {} device_cap_flags {:#010x} XRC {}",
        info.name,
        info.cap_flags,
        if info.cap_flags & IBV_DEVICE_XRC != 0 {
            "yes"
        } else {
            "no"
        }
    );
    if o.force {
        match raw.probe_open_xrcd() {
            Ok(()) => println!("ibv_open_xrcd (forced): ok"),
            Err(e) => println!("ibv_open_xrcd (forced): {e}"),
        }
    }
    drop(raw);
    let mut v = match RdmaVerbs::open(o.device.as_deref()) {
        Ok(v) => v,
        Err(e @ VerbsError::NoXrc { .. }) => {
            eprintln!("xrc-probe: {e}");
            println!("error: {e}");
            return result(2, &format!("no-xrc device={}", info.name));
        }
        Err(e) => {
            eprintln!("xrc-probe: {e}");
            return result(1, "error");
        }
    };
    if o.exercise {
        if let Err(e) = exercise(&mut v, &o.file) {
            eprintln!("xrc-probe: {e}");
            return result(1, &format!("error {e}"));
        }
    }
    result(0, &format!("xrc-ok device={}", info.name))
}

fn exercise(v: &mut RdmaVerbs, file: &str) -> Result<(), VerbsError> {
    let private = v.open_xrcd(&DomainSpec::Private)?;
    println!("private domain: ok");
    let shared = v.open_xrcd(&DomainSpec::file(file))?;
    println!("shared domain on {file}: ok");
    let tgt = v.create_tgt_qp(shared)?;
    let qpn = v.qp_num(tgt)?;
    println!("TGT QP {qpn}");
    let opened = v.open_tgt_qp(shared, qpn)?;
    println!("ibv_open_qp({qpn}): second handle ok");
    v.modify_qp(tgt, &QpAttr::to_init(0, 1, AccessFlags::default()))?;
    let st = v.query_qp(opened)?.state;
    println!("TGT QP state through the other handle: {st}");
    if st != QpState::Init {
        return Err(VerbsError::Unavailable(format!("expected INIT, got {st}")));
    }
    let srq = XrcSrq::create(v, shared, &SrqAttr::default())?;
    println!("XRC SRQ number {}", srq.srqn());
    let ini = IniQp::create(v, &IniQpCaps::default())?;
    println!("INI QP {}", ini.qpn());
    ini.destroy(v)?;
    srq.destroy(v)?;
    v.destroy_qp(opened)?;
    v.destroy_qp(tgt)?;
    v.close_xrcd(shared)?;
    v.close_xrcd(private)?;
    println!("teardown: ok");
    Ok(())
}

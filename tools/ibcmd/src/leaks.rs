//! `ibcmd leaks --socket PATH`: the TGT QPs of a running daemon that have no living owner
//! (orphans) or that nobody uses (leaks), as `xrcd-keeper leaks` lists the keeper's; and
//! `ibcmd reclaim --socket PATH [--qpn N]`: destroy orphans of this user (root: any user's).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ibcm::rt::node::proto::{
    encode_frame, read_frame, ClientMsg, DaemonMsg, Op, WireResult, WireTgtQp, VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// Runs the command; prints one line per QP ("no leaks" when there is none).
pub(crate) fn main(socket: &Path, json: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ibcmd leaks: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(ask(socket, Op::XrcOrphans)) {
        Ok(WireResult::XrcQps { qps }) => {
            if json {
                match serde_json::to_string(&qps) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("ibcmd leaks: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print(&qps);
            }
            ExitCode::SUCCESS
        }
        Ok(other) => {
            eprintln!("ibcmd leaks: the daemon answered {other:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ibcmd leaks: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `ibcmd reclaim`: destroys the orphans of this user (root: of any user), all of them or
/// `qpn`; prints how many.
pub(crate) fn reclaim(socket: &Path, qpn: Option<u32>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ibcmd reclaim: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(ask(socket, Op::XrcReclaim { qpn })) {
        Ok(WireResult::Value { value }) => {
            println!("reclaimed {value} TGT QPs");
            ExitCode::SUCCESS
        }
        Ok(WireResult::Refused { why }) => {
            eprintln!("ibcmd reclaim: refused: {why}");
            ExitCode::FAILURE
        }
        Ok(other) => {
            eprintln!("ibcmd reclaim: the daemon answered {other:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ibcmd reclaim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print(qps: &[WireTgtQp]) {
    if qps.is_empty() {
        println!("no leaks");
    }
    for q in qps {
        let what = if q.orphan { "orphan" } else { "leak" };
        let uid = q.uid.map_or_else(|| "?".to_string(), |u| u.to_string());
        let idle = if q.orphan && q.leak { " (idle)" } else { "" };
        println!(
            "{what} qp {:#08x} domain={} policy={} uid={uid} conns={}{idle}",
            q.qpn, q.domain, q.policy, q.conns
        );
    }
}

/// Hello, then `op`; its answer.
async fn ask(socket: &Path, op: Op) -> Result<WireResult> {
    let mut s = UnixStream::connect(socket)
        .await
        .with_context(|| format!("cannot connect to {}", socket.display()))?;
    // Believe only a daemon run by root or by this user.
    let cred = s.peer_cred()?;
    let me = std::fs::metadata("/proc/self")?.uid();
    if cred.uid() != 0 && cred.uid() != me {
        bail!(
            "{} is served by uid {}, neither root nor this user ({me})",
            socket.display(),
            cred.uid()
        );
    }
    for (seq, op) in [
        (
            0,
            Op::Hello {
                version: VERSION,
                addr: false,
            },
        ),
        (1, op),
    ] {
        s.write_all(&encode_frame(&ClientMsg { seq, op })?).await?;
    }
    loop {
        match read_frame::<DaemonMsg, _>(&mut s).await? {
            DaemonMsg::Reply {
                seq: 0,
                result: WireResult::Ok,
            } => {}
            DaemonMsg::Reply { seq: 1, result } => return Ok(result),
            DaemonMsg::Reply { result, .. } => bail!("the daemon answered {result:?}"),
            _ => {}
        }
    }
}

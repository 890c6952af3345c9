//! `ibcmd leaks --socket PATH`: the TGT QPs of a running daemon that have no living owner
//! (orphans) or that nobody uses (leaks), as `xrcd-keeper leaks` lists the keeper's; and
//! `ibcmd reclaim --socket PATH [--qpn N]`: destroy orphans of this user (root: any user's).

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ibcm::rt::node::proto::WireTgtQp;
use ibcm::rt::node::{attach, Attached};

/// Runs `f` on a current-thread runtime; its error goes to standard error after `name`.
fn run(name: &str, f: impl Future<Output = Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A session with the daemon at `socket` (a client like any other: `attach` believes only a
/// daemon run by root or by this user).
async fn session(socket: &Path) -> Result<Attached> {
    attach(socket)
        .await
        .with_context(|| format!("cannot attach to {}", socket.display()))
}

/// Runs the command; prints one line per QP ("no leaks" when there is none).
pub(crate) fn main(socket: &Path, json: bool) -> ExitCode {
    run("ibcmd leaks", async {
        let a = session(socket).await?;
        let qps = a.node.xrc_orphans().await?;
        if json {
            println!("{}", serde_json::to_string(&qps)?);
        } else {
            print(&qps);
        }
        Ok(())
    })
}

/// `ibcmd reclaim`: destroys the orphans of this user (root: of any user), all of them or
/// `qpn`; prints how many.
pub(crate) fn reclaim(socket: &Path, qpn: Option<u32>) -> ExitCode {
    run("ibcmd reclaim", async {
        let a = session(socket).await?;
        let value = a.node.xrc_reclaim(qpn).await?;
        println!("reclaimed {value} TGT QPs");
        Ok(())
    })
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

//! cm-ping as a client of the node's CM service (`--daemon PATH`): the endpoint is `ibcmd`'s
//! (`Cm::attach`), every other option works as with an endpoint of its own. A listener with
//! `--xrc` has the daemon serve its service as an XRC target (`--policy explicit|domain|
//! process|shared` for the TGT QPs it creates) and prints the daemon's reports about it.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{Context, Result};
use ibcm::rt::node::{attach, Node};
use ibcm::rt::Cm;
use ibcm_mad::ServiceId;

use super::counts::Counts;

/// The SRQ numbers an XRC listener announces (cm-ping has no real SRQs).
const SRQNS: [u32; 2] = [0x10, 0x11];

/// Attaches to the daemon at `path`.
pub(crate) async fn attach_cm(path: &Path) -> Result<(Cm, Node)> {
    let a = attach(path)
        .await
        .with_context(|| format!("cannot attach to the node CM service at {}", path.display()))?;
    Ok((a.cm, a.node))
}

/// The XRC listener through the daemon: until SIGINT/SIGTERM, prints what the daemon's
/// target reports; on a signal destroys its TGT QPs (as their owner) and prints the summary.
pub(crate) async fn xrc_listen(
    node: &Node,
    sid: ServiceId,
    policy: &str,
    quiet: bool,
    counts: &Arc<Counts>,
) -> Result<()> {
    // Caught before the "listening" line: a script may signal as soon as it sees it.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    node.xrc_listen(sid, policy, &SRQNS).await?;
    // Printed even with --quiet: scripts wait for it before they connect.
    println!("listening on the node CM service service_id={sid} XRC policy={policy}");
    loop {
        let line = tokio::select! {
            l = node.xrc_event() => l,
            _ = sigint.recv() => None,
            _ = sigterm.recv() => None,
        };
        let Some(line) = line else {
            break;
        };
        if line.starts_with("established") {
            counts.established.fetch_add(1, Ordering::Relaxed);
        } else if line.starts_with("closed") {
            counts.disconnected.fetch_add(1, Ordering::Relaxed);
        } else if line.starts_with("rejected") {
            counts.rejected.fetch_add(1, Ordering::Relaxed);
        }
        if !quiet {
            println!("{line}");
        }
    }
    // The owner's way out: its QPs are destroyed ("owner destroyed it"), whatever the policy
    // would do at its exit.
    match node.xrc_destroy().await {
        Ok(n) if !quiet => println!("destroyed {n} TGT QP(s)"),
        Ok(_) => {}
        Err(e) => eprintln!("cm-ping: destroying the TGT QPs: {e}"),
    }
    println!("{}", counts.line());
    Ok(())
}

//! `ibcmd xrc --socket PATH [--hold]`: one client session of a running `ibcmd`, driven by
//! JSON lines on standard input — the keeper's requests (`{"op":"open-domain",…}`,
//! `create`, `register`, `unregister`, `modify`, `query`, `destroy`, `status`, `leaks`, …,
//! docs/xrc.md §8.5) and the session's XRC services (`{"op":"xrc-listen","service_id":N,
//! "policy":P,"srqns":[…],"domain":D,"tgt_qpn":Q}`, `{"op":"xrc-unlisten","service_id":N}`).
//! Each reply is one JSON line on standard output, in order (the keeper's reply object;
//! for the services `{"ok":true}` or `{"ok":false,"error":…}`); keeper events come as
//! their own lines (`{"event":"qp-gone",…}`), the service's reports as
//! `{"xrc-event":"…"}`. The session ends at the end of input (with `--hold`: when the
//! process is killed) — its holdings then end per their policies, as for any client.

use std::io::BufRead;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ibcm::rt::node::{attach, Node, NodeError};
use ibcm_mad::ServiceId;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Runs the session; exit status 0 unless the daemon could not be reached or went away.
pub(crate) fn main(socket: &Path, hold: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ibcmd xrc: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(socket, hold)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ibcmd xrc: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn out(v: &Value) {
    println!("{v}");
}

async fn run(socket: &Path, hold: bool) -> Result<()> {
    let attached = attach(socket)
        .await
        .with_context(|| format!("cannot attach to {}", socket.display()))?;
    let node = attached.node;
    let _cm = attached.cm;
    // Standard input on a thread of its own (blocking reads), lines into the runtime.
    let (tx, mut lines) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { return };
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let mut input = true;
    loop {
        tokio::select! {
            l = lines.recv(), if input => match l {
                Some(l) if l.trim().is_empty() => {}
                Some(l) => out(&request(&node, &l).await?),
                None if hold => input = false,
                None => return Ok(()),
            },
            ev = node.keeper_event() => match ev {
                Some(ev) => out(&ev),
                None => anyhow::bail!("the daemon went away"),
            },
            ev = node.xrc_event() => match ev {
                Some(text) => out(&json!({ "xrc-event": text })),
                None => anyhow::bail!("the daemon went away"),
            },
        }
    }
}

fn refused(e: &NodeError) -> Value {
    json!({ "ok": false, "error": e.to_string() })
}

/// One input line: a service request, else a keeper request.
async fn request(node: &Node, line: &str) -> Result<Value> {
    let v: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Ok(json!({ "ok": false, "error": format!("not JSON: {e}") })),
    };
    let op = v.get("op").and_then(Value::as_str).unwrap_or_default();
    let sid = v.get("service_id").and_then(Value::as_u64).map(ServiceId);
    let r = match (op, sid) {
        ("xrc-listen", Some(sid)) => {
            let policy = v.get("policy").and_then(Value::as_str).unwrap_or("shared");
            let srqns: Vec<u32> = v
                .get("srqns")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect()
                })
                .unwrap_or_default();
            let qpn = v
                .get("tgt_qpn")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok());
            match v.get("domain").and_then(Value::as_str) {
                Some(d) => node.xrc_listen_in(sid, policy, &srqns, d, qpn).await,
                None => node.xrc_listen(sid, policy, &srqns).await,
            }
        }
        ("xrc-unlisten", Some(sid)) => node.xrc_unlisten(sid).await,
        ("xrc-listen" | "xrc-unlisten", None) => {
            return Ok(json!({ "ok": false, "error": "service_id missing" }))
        }
        _ => {
            return match node.keeper(v).await {
                Ok(reply) => Ok(reply),
                Err(NodeError::Gone) => Err(NodeError::Gone.into()),
                Err(e) => Ok(refused(&e)),
            }
        }
    };
    match r {
        Ok(()) => Ok(json!({ "ok": true })),
        Err(NodeError::Gone) => Err(NodeError::Gone.into()),
        Err(e) => Ok(refused(&e)),
    }
}

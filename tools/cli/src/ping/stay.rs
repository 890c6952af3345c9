//! `--stay` (active side): keep every established connection until SIGINT/SIGTERM or until
//! each one has been ended by the peer. Each peer teardown prints
//! `conn <n> closed by peer after <ms> ms: <reason>` (n: the connection's number in this
//! run, from 0 in the order they were established; ms: since every connection was up; for an
//! XRC DREQ carrying the target-gone block the reason is its cause in words, e.g.
//! `target gone (creator exited)`); a connection that ends otherwise (the node service lost,
//! say) prints `conn <n> ended here after <ms> ms: <why>` and is not counted as closed by the
//! peer. On a signal the rest are disconnected. The last line is
//! `cm-ping: N established, R rejected, T timed out, D disconnected, P closed by peer`, and
//! `, X disconnect timed out` after it when X DREQs were never answered.

use std::sync::atomic::Ordering;
use std::time::Instant;

use ibcm::proto::ConnectionError;
use ibcm::rt::Connection;
use ibcm_mad::xrc::TargetGone;
use tokio::task::JoinSet;

use super::counts::Counts;
use super::out::hex_trim;

/// Whether the peer ended the connection (its DREQ, REJ or stale report), not this side or
/// the loss of the node service.
pub(crate) fn by_peer(why: &ConnectionError) -> bool {
    matches!(
        why,
        ConnectionError::Disconnected { by_peer: true, .. }
            | ConnectionError::Rejected { .. }
            | ConnectionError::Stale
            | ConnectionError::TimedOut
    )
}

/// Why the peer ended a connection, in words.
pub(crate) fn peer_reason(why: &ConnectionError) -> String {
    match why {
        ConnectionError::Disconnected {
            by_peer: true,
            private_data,
        } => match TargetGone::parse(private_data) {
            Some(tg) => match tg.qpn {
                Some(q) => format!("{} (DREQ, tgt_qpn {q})", tg.kind),
                None => format!("{} (DREQ)", tg.kind),
            },
            None if private_data.iter().all(|&b| b == 0) => "DREQ".to_string(),
            None => format!("DREQ pd={}", hex_trim(private_data)),
        },
        other => other.to_string(),
    }
}

/// The summary line of `--stay`.
pub(crate) fn line(counts: &Counts, by_peer: u64) -> String {
    // DREQs never answered (the peer unreachable): only when there were any.
    let unanswered = match counts.disconnect_timed_out.load(Ordering::Relaxed) {
        0 => String::new(),
        n => format!(", {n} disconnect timed out"),
    };
    format!(
        "cm-ping: {} established, {} rejected, {} timed out, {} disconnected, {by_peer} closed by peer{unanswered}",
        counts.established.load(Ordering::Relaxed),
        counts.rejected.load(Ordering::Relaxed),
        counts.timed_out.load(Ordering::Relaxed),
        counts.disconnected.load(Ordering::Relaxed),
    )
}

/// Stays (module docs); returns how many connections the peer ended.
pub(crate) async fn stay(quiet: bool, counts: &Counts, held: Vec<Connection>) -> u64 {
    let start = Instant::now();
    let mut open: Vec<Option<Connection>> = held.iter().cloned().map(Some).collect();
    let mut set = JoinSet::new();
    for (n, conn) in held.into_iter().enumerate() {
        set.spawn(async move { (n, conn.closed().await) });
    }
    let signals = (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()),
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()),
    );
    let (Ok(mut sigint), Ok(mut sigterm)) = signals else {
        eprintln!(
            "cm-ping: cannot catch SIGINT/SIGTERM; staying until the peer ends every connection"
        );
        return wait_all(quiet, start, &mut set).await;
    };
    let mut by_peer = 0;
    loop {
        tokio::select! {
            r = set.join_next() => match r {
                None => break,
                Some(Ok((n, why))) => {
                    if let Some(slot) = open.get_mut(n) {
                        *slot = None;
                    }
                    if report(quiet, start, n, &why) {
                        by_peer += 1;
                    }
                }
                Some(Err(_)) => {}
            },
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    set.abort_all();
    // Ended here: disconnect the rest, all at once.
    let mut closing = JoinSet::new();
    for conn in open.into_iter().flatten() {
        closing.spawn(async move { conn.disconnect(&[]).await });
    }
    while let Some(r) = closing.join_next().await {
        if let Ok(why) = r {
            counts.count_end(&why);
        }
    }
    by_peer
}

/// Prints how connection `n` ended; whether the peer ended it.
fn report(quiet: bool, start: Instant, n: usize, why: &ConnectionError) -> bool {
    let peer = by_peer(why);
    if !quiet {
        let ms = start.elapsed().as_millis();
        if peer {
            println!(
                "conn {n} closed by peer after {ms} ms: {}",
                peer_reason(why)
            );
        } else {
            println!("conn {n} ended here after {ms} ms: {why}");
        }
    }
    peer
}

async fn wait_all(quiet: bool, start: Instant, set: &mut JoinSet<(usize, ConnectionError)>) -> u64 {
    let mut by_peer = 0;
    while let Some(r) = set.join_next().await {
        if let Ok((n, why)) = r {
            if report(quiet, start, n, &why) {
                by_peer += 1;
            }
        }
    }
    by_peer
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm_mad::xrc::{GoneCause, RejectKind};

    #[test]
    fn xrc_causes_are_words() {
        let tg = TargetGone {
            kind: RejectKind::Gone(GoneCause::CreatorExited),
            qpn: None,
        };
        let why = ConnectionError::Disconnected {
            by_peer: true,
            // As the runtime delivers it: trailing zeros trimmed.
            private_data: tg.to_bytes()[..11].to_vec(),
        };
        assert_eq!(peer_reason(&why), "target gone (creator exited) (DREQ)");
        let plain = ConnectionError::Disconnected {
            by_peer: true,
            private_data: Vec::new(),
        };
        assert_eq!(peer_reason(&plain), "DREQ");
        let c = Counts::default();
        c.established.fetch_add(4, Ordering::Relaxed);
        assert_eq!(
            line(&c, 4),
            "cm-ping: 4 established, 0 rejected, 0 timed out, 0 disconnected, 4 closed by peer"
        );
    }
}

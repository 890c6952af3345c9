//! The journal of the connections on TGT QPs: the XRC target's connections are journaled as
//! the daemon's others are, so that a restart ends them too.

use ibcm::proto::ConnId;
use ibcm::rt::node::proto::WirePeer;
use ibcm::rt::node::{EventSink, JournalEntry, JournalTx};
use ibcm_mad::ServiceId;
use ibcm_xrc::cm::rt::XrcServer;
use tokio::sync::mpsc;
use tracing::warn;

/// A connection on a TGT QP established (`true`, with the report for its client) or ended.
pub(super) type JournalNote = (ConnId, bool, Option<(EventSink, ServiceId, String)>);

/// Keeps the journal of the connections on TGT QPs.
pub(super) async fn journal_xrc(
    server: XrcServer,
    journal: JournalTx,
    mut rx: mpsc::UnboundedReceiver<JournalNote>,
) {
    while let Some((conn, up, report)) = rx.recv().await {
        if !up {
            journal.remove(conn.0);
            continue;
        }
        let known = server
            .with(move |_, ep, _| {
                Some((
                    ep.remote_comm_id(conn)?,
                    ep.remote_qpn(conn)?,
                    ep.peer(conn)?,
                ))
            })
            .await;
        if let Ok(Some((remote_comm_id, remote_qpn, peer))) = known {
            let added = journal.add(JournalEntry {
                comm_id: conn.0,
                remote_comm_id: remote_comm_id.0,
                remote_qpn: remote_qpn.get(),
                peer: WirePeer::from_peer(&peer),
                xrc_tgt: true,
            });
            if let Err(e) = added {
                // Not journaled: not reported established, and ended at the initiator.
                warn!(%conn, error = %e, "XRC connection refused: it cannot be journaled");
                let _ = server
                    .with(move |_, ep, now| ep.disconnect(now, conn, &[]))
                    .await;
                if let Some((sink, sid, _)) = report {
                    sink.xrc_event(
                        sid,
                        format!("refused conn={conn}: the daemon's journal cannot note it ({e})"),
                    );
                }
                continue;
            }
        }
        if let Some((sink, sid, line)) = report {
            sink.xrc_event(sid, line);
        }
    }
}

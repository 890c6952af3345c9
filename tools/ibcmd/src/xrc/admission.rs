//! The XRC target's admission of a REQ: the connection quotas of its service's session and
//! user, and the quotas of TGT QPs it would create.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ibcm::rt::node::NodeServer;
use ibcm_xrc::cm::AdmissionQuery;
use tracing::warn;

use super::{lock, Routes};

/// REQs refused by the quotas (for the log: the first, then every 1,024th).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// The XRC target's admission hook: the connection quotas of the service's session and user
/// ([`NodeServer::xrc_connection_quota`]), and, for a REQ that would create a TGT QP, the
/// user's TGT QP quota (its live QPs, orphans included) and, for a user other than root,
/// the quota of all users but root together.
pub(super) fn admission(
    routes: Arc<Mutex<Routes>>,
    node: Arc<OnceLock<Weak<NodeServer>>>,
) -> ibcm_xrc::cm::TargetAdmission {
    Box::new(move |q: &AdmissionQuery<'_>| {
        let Some(node) = node.get().and_then(Weak::upgrade) else {
            return Ok(());
        };
        let Some(info) = lock(&routes).owners.get(&q.service_id).copied() else {
            return Ok(());
        };
        let mut why = node.xrc_connection_quota(info);
        if why.is_none() && q.creates {
            let cfg = node.config();
            let (held, others) = {
                let r = lock(&routes);
                // One pass over the live QPs: this user's, and all users' but root's
                // together (only asked for a user that is not root).
                let (mut held, mut others) = (0usize, 0usize);
                for uid in q.registry.live_creators().filter_map(|p| r.uids.get(&p)) {
                    held += usize::from(*uid == info.uid);
                    others += usize::from(*uid != 0);
                }
                (held, (info.uid != 0).then_some(others))
            };
            if held >= cfg.max_tgt_qps_per_user {
                why = Some(format!(
                    "quota: {} TGT QPs of uid {}",
                    cfg.max_tgt_qps_per_user, info.uid
                ));
            } else if others.is_some_and(|n| n >= cfg.max_tgt_qps_non_root) {
                why = Some(format!(
                    "quota: {} TGT QPs of the users other than root",
                    cfg.max_tgt_qps_non_root
                ));
            }
        }
        let Some(why) = why else {
            return Ok(());
        };
        let n = REFUSED.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if n == 1 || n.is_multiple_of(1024) {
            warn!(
                session = info.id,
                service = %q.service_id,
                refused = n,
                why = %why,
                "XRC REQ over a quota: REJ 3 no resources"
            );
        }
        Err(why)
    })
}

//! Finding 6 of issue 12 (the core's part): hostile traffic is counted, not logged line by
//! line. Every drop has a `Stats` reason; the core's debug lines are rate-limited.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod sec_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ibcm::proto::*;
use ibcm_mad::*;
use sec_common::*;

/// A subscriber that counts the events it sees.
struct Count(Arc<AtomicU64>);

impl tracing::Subscriber for Count {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if *e.metadata().level() <= tracing::Level::DEBUG {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Finding 6: a flood of malformed MADs, REQs for unknown services and REQs that a listener
/// takes produced one debug line per packet. Now at most a burst per second, the rest
/// counted (`Stats::log_suppressed`); every drop is still counted by reason.
#[test]
fn hostile_flood_is_counted_not_logged() {
    let lines = Arc::new(AtomicU64::new(0));
    let mut p = Pair::new(EndpointConfig::default());
    let src = addr("192.0.2.1:4791");
    tracing::subscriber::with_default(Count(lines.clone()), || {
        for i in 0..1000u32 {
            p.l.handle_datagram(p.now, src, &[0u8; 17]);
            let mut req = Req {
                local_comm_id: CommId(0x100 + i),
                service_id: ServiceId(0xdead),
                local_ca_guid: Guid(0xbad),
                local_qpn: Qpn::masked(0x10 + i),
                ..Req::default()
            };
            req.set_transport(ReqTransport::Rc);
            p.l.handle_datagram(
                p.now,
                src,
                &Mad::new(Tid(1), CmMessage::Req(req)).to_bytes(),
            );
            p.l.handle_datagram(
                p.now,
                src,
                &hostile_req(0x10_0000 + i, 0xbad, 0x10 + i, 20, 15),
            );
            let _ = p.l_step();
        }
    });
    let n = lines.load(Ordering::Relaxed);
    assert!(n <= 40, "{n} debug lines for 3000 hostile packets");
    assert!(p.l.stats().log_suppressed >= 2900);
    assert_eq!(p.l.stats().dropped(DropReason::Malformed), 1000);
    // Drops are all counted by reason and shown.
    let shown = p.l.stats().to_string();
    assert!(shown.contains("dropped.malformed=1000"), "{shown}");
    assert!(shown.contains("log_suppressed="), "{shown}");
}

//! Unit tests of the target's glue.

use ibcm::proto::ConnectionError;

use super::*;

#[test]
fn closes_map_to_registry_events() {
    let by_peer = ConnectionError::Disconnected {
        by_peer: true,
        private_data: vec![],
    };
    assert_eq!(conn_event_of(&by_peer), ConnEvent::PeerDreq);
    assert_eq!(
        conn_event_of(&ConnectionError::TimedOut),
        ConnEvent::PeerTimeout
    );
    assert_eq!(
        conn_event_of(&ConnectionError::Stale),
        ConnEvent::PeerTimeout
    );
    assert_eq!(
        conn_event_of(&ConnectionError::DisconnectTimedOut),
        ConnEvent::LocalClosed
    );
}

//! The end of an active connection, with or without a data path: its disconnect, counted.

use ibcm::rt::Connection;

use super::args::{Args, Who};
use super::counts::Counts;
use super::out::out;

/// Disconnects (or waits for the passive side's DREQ) and counts the outcome.
pub(crate) async fn finish(args: &Args, counts: &Counts, conn: Connection) {
    let why = match args.disconnect_from {
        Who::Active => conn.disconnect(&[]).await,
        Who::Passive => conn.closed().await,
    };
    counts.count_end(&why);
    out(
        args,
        format_args!("disconnected conn={} ({why})", conn.id()),
    );
}

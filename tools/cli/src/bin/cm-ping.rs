//! `cm-ping`: the ibcm CM engine's command-line face (like rdma-core's `ucmatose`).
//!
//! ```text
//! cm-ping --listen ADDR [--service-id ID | --port P] [--reject REASON] [--accept-delay MS]
//!         [--mra-on-duplicate] [--accept-data HEX] [--sidr-qpn QPN [--sidr-qkey QKEY]]
//!         [--timewait-slack MS] [--stateless [--stateless-threshold N] [--stateless-always]
//!         [--stateless-qpns BASE:COUNT]] [--peer-counts]
//! cm-ping --connect ADDR[:PORT] [--bind IP] [--service-id ID | --port P] [--count N]
//!         [--parallel K] [--hold] [--xrc] [--private-data HEX] [--disconnect-from active|passive]
//!         [--rtu-delay MS | --reject-rep REASON [--reject-data HEX]] [--sidr]
//!         [--stay] [--local-timeout-exp N] [--local-ack-timeout N] [--same-qpn (test only)]
//! cm-ping --daemon PATH …   (any of the above through the node's CM service, `ibcmd`;
//!         a listener takes --xrc --policy explicit|domain|process|shared)
//! cm-ping --umad DEV --listen ib [--accept-laps]                 (native InfiniBand port)
//! cm-ping --umad DEV --connect lid:N|gid:G [--alt-path [--migrate]] [--stats] …
//! ```
//!
//! Transport: RoCEv2 over UDP on port 4791 of the bound IP (default), or Linux umad with
//! `--umad /dev/infiniband/umadN --gid-index I --local-ip IP` on a RoCE port, or `--umad
//! /dev/infiniband/umadN` alone on a native InfiniBand port (peers by LID or GID, the path
//! from the SA, MADs LID-routed; docs/sa.md §4.1). Connecting to `IP:PORT` uses the
//! rdma_cm conventions (service ID `0x0106 << 16 | PORT`, CMA IP header in the private data),
//! so a Linux `rping -s`/`ucmatose` listener answers; `--service-id` gives a raw IB service ID.
//!
//! One line per event; the last line is
//! `cm-ping: N established, R rejected, T timed out, D disconnected, X disconnect timed out`
//! (D counts the connections whose DREQ was answered or came from the peer; X those whose
//! DREQ was never answered). The listener accepts by default and runs until killed:
//! SIGINT/SIGTERM print the summary line, then the endpoint's counters as one JSON object (its
//! last line; [`ibcm::rt::CmStats::to_json`]), and end the process at once: the listener's
//! connections are not disconnected (no DREQ), as a killed peer's are not. The listener's event lines are rate-limited
//! (peers decide how many arrive). `--connect` exits 0 when every connection was established
//! and none of their disconnects timed out, 2 otherwise.
//!
//! QPNs are unique and random within the 24-bit space, start PSNs random (the endpoint's
//! RNG: the default of a connect, drawn with `Cm::random_psn` for an accept): cm-ping has no
//! real QPs, so it chooses them like an application should.

use std::process::ExitCode;

use clap::Parser;
use ibcm_tools::ping::{run, Args};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CM_PING_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cm-ping: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cm-ping: {e:#}");
            ExitCode::FAILURE
        }
    }
}

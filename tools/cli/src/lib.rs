//! The code of ibcm's command-line tools, `cm-ping` ([`ping`]) and `cm-bench` ([`bench`](mod@bench)):
//! each binary (`src/bin/`) parses its command line and runs it through this library.

pub mod bench;
pub mod ping;
mod qpn;

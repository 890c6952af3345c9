//! `xrcd-keeper`: holds XRC domains and TGT QP handles for `DomainBound` and `Shared` QPs
//! across jobs, so they outlive the processes that use them (docs/xrc.md §7), for CMs that
//! report their REQs to it (`accept-req`). On a node that runs `ibcmd`, the same operations
//! are served on `ibcmd`'s socket, on the registry its CM answers REQs from (docs/xrc.md
//! §8.5; `ibcmd xrc`).
//!
//! ```text
//! xrcd-keeper serve  --socket PATH [--backend sim|verbs] [--device NAME] [--quarantine-ms N]
//! xrcd-keeper status --socket PATH [--json]     domains, TGT QPs, policy, holders by PID
//! xrcd-keeper leaks  --socket PATH [--json]     TGT QPs with no connection, owner or registration
//! xrcd-keeper hold   --socket PATH --domain NAME [--path FILE] --shared-qp [--key KEY]
//! xrcd-keeper request --socket PATH JSON...   requests in one session, one reply per line
//! ```
//!
//! `serve` refuses a `--socket` path that exists and is not a socket (it never deletes such a
//! file). Clients (`status`, `leaks`, `hold`, `request`) talk only to a keeper run by root or
//! by their own user. Every domain and TGT QP belongs to the uid of the client that made it;
//! another uid gets `permission-denied` (`ibcm_xrc::keeper` docs, "Who may do what").
//!
//! ```text
//! $ xrcd-keeper request --socket /run/xrcd.sock '{"op":"open-domain","domain":"d"}' \
//!       '{"op":"create","domain":"d","policy":"explicit"}'
//! {"domain":"d"}
//! {"policy":"explicit","qpn":72}
//! ```
//!
//! `serve` prints `ready epoch=… socket=… backend=… device=…` once it accepts connections and
//! logs what it does on stderr. `hold` creates or registers the domain's `Shared` TGT QP,
//! prints its QPN (`0x000048`) as the first line on stdout and holds the registration until
//! it is killed; its death releases exactly its reference. If the keeper goes away, `hold`
//! says that all keeper-held QPs are gone (and whether a new keeper instance took over) and
//! exits with status 3; if its QP goes, it exits with status 4.
//!
//! Protocol and semantics: `ibcm_xrc::keeper`.

use std::process::ExitCode;

fn main() -> ExitCode {
    ibcm_xrc::keeper::cli::main_from(std::env::args_os())
}

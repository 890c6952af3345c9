//! `libibcm`: the C interface of ibcm's node CM service client (`ibcm.h`, `libibcm.so`,
//! `libibcm.a`, `ibcm.pc`).
//!
//! A C runtime attaches to the node's `ibcmd` (`ibcm_open`) and drives connections from its
//! progress loop the way librdmacm's event channel is driven: a pollable fd, events taken
//! with `ibcm_get_event` and given back with `ibcm_ack_event`, and calls to listen, connect,
//! accept, reject, establish and disconnect, plus the QP attributes of each transition
//! (`ibcm::qp_attr`), path migration (LAPs sent and answered, the alternate path's QP
//! attributes) and the XRC target services the daemon hosts. Under it is the Rust client,
//! `ibcm::rt::node::attach`, on a tokio runtime of the library's own.
//!
//! * `ffi`: the C ABI (every `unsafe` and `extern "C"` of the crate); `ffi::types`, with the
//!   opaque `ffi::ctx` and the functions of `ffi::api`, `ffi::conn`, `ffi::apm`, `ffi::xrc`
//!   and `ffi::data`, is what cbindgen turns into `ibcm.h` (build.rs; the committed copy is
//!   `include/ibcm.h`);
//! * `context`: one attachment, its connection handles and the tasks that make events
//!   (`context::apm`: a connection's paths and LAPs);
//! * `event`: the event queue and its fd;
//! * `params`: the C parameter structs as ibcm's, ibcm's QP attributes as the C struct;
//! * `error`: the status codes.
//!
//! Build, install and use: `docs/capi.md`; the contract test: `tests/c-abi/run`.

mod context;
mod error;
mod event;
pub mod ffi;
mod params;

#[cfg(test)]
mod header_tests {
    /// The committed `include/ibcm.h` is the one cbindgen generates from the sources now
    /// (`IBCM_CAPI_BLESS=1` rewrites it).
    #[test]
    fn header_is_current() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/ibcm.h"));
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/ibcm.h");
        if std::env::var_os("IBCM_CAPI_BLESS").is_some() {
            std::fs::write(path, generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "cm/capi/include/ibcm.h differs from the header cbindgen generates: \
             run IBCM_CAPI_BLESS=1 cargo test -p ibcm-capi header, review and commit it"
        );
    }
}

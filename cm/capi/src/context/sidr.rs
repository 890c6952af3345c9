//! SIDR both ways and the counters: [`Context::sidr_query`], [`Context::sidr_reply`],
//! [`Context::counters`].

use ibcm::proto::{SidrRepParams, SidrReqParams};
use ibcm::rt::CmError;

use super::{Context, Taken};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ffi::types::ibcm_event_type::*;
use crate::ffi::types::ibcm_status::*;

/// The answer to a SIDR_REQ the application rejected (or left unanswered).
pub(super) fn sidr_rejected() -> SidrRepParams {
    let mut rep = SidrRepParams::success(ibcm_mad::Qpn::masked(0), ibcm_mad::Qkey(0));
    rep.status = ibcm_mad::SidrStatus::Rejected;
    rep
}

impl Context {
    /// Sends a SIDR_REQ (`params`) through the daemon; its handle gets `context`. The answer
    /// comes as `SIDR_REPLY` (any status) or `UNREACHABLE`, the handle's final event.
    pub(crate) fn sidr_query(&self, params: SidrReqParams, context: usize) -> Result<u64> {
        self.live()?;
        let (cm, s) = (self.cm.clone(), self.shared.clone());
        self.start(context, move |h, mut cancelled| async move {
            let r = tokio::select! {
                r = cm.sidr(params) => r,
                Ok(()) = &mut cancelled => {
                    let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
                    ev.status = IBCM_ECLOSED;
                    ev.reason = "cancelled by ibcm_disconnect".into();
                    return s.finish(h, ev);
                }
            };
            let ev = match r {
                Ok(a) => {
                    let mut ev = Event::new(IBCM_EVENT_SIDR_REPLY, h);
                    ev.sidr_status = u32::from(a.status.raw());
                    ev.remote_qpn = a.qpn.get();
                    ev.qkey = a.qkey.0;
                    ev.private_data = a.private_data;
                    ev
                }
                Err(CmError::SidrTimedOut) => {
                    let mut ev = Event::new(IBCM_EVENT_UNREACHABLE, h);
                    ev.status = IBCM_ECLOSED;
                    ev.reason = "no SIDR_REP after every retry".into();
                    ev
                }
                Err(e) => {
                    let e = Error::from(e);
                    let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
                    ev.status = e.code;
                    ev.reason = e.msg;
                    ev
                }
            };
            s.finish(h, ev);
        })
    }

    /// Answers the SIDR_REQ of `h` (a `SIDR_REQUEST` handle, forgotten once answered).
    pub(crate) fn sidr_reply(&self, h: u64, rep: SidrRepParams) -> Result<()> {
        let inc = match self.take(h, "ibcm_sidr_reply")? {
            Taken::SidrIn(inc) => inc,
            t => return Err(self.wrong(h, t, "ibcm_sidr_reply")),
        };
        let r = self.block_on(inc.sidr_reply(rep))?;
        self.shared.forget(h);
        r.map_err(Error::from)
    }

    /// The daemon endpoint's counters, name and value.
    pub(crate) fn counters(&self) -> Result<Vec<(String, u64)>> {
        self.live()?;
        let mut all = self.block_on(self.cm.stats())??.counters();
        all.extend(self.xrc_data_counters()?);
        Ok(all)
    }
}

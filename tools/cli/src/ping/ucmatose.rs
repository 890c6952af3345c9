//! ucmatose's exchange on an RC QP (`librdmacm/examples/cmatose.c`): both sides post
//! `count` receives of `size` bytes before connecting; once connected the server SENDs
//! `count` messages and waits for its sends and for `count` messages back; the client waits
//! for the server's messages, then SENDs `count` replies. The server then disconnects.
//!
//! ucmatose sends an uninitialised buffer, so what arrives is checked by count and length
//! only; what ibcm sends is a recognisable pattern (`ibcm-msg-<i>` repeated).

use anyhow::{bail, Result};
use ibcm_xrc::verbs::rc::{Access, CompletionOp, MemoryRegion, SendOp};

use super::qp::ConnQp;

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;

/// One connection's message buffers.
pub(super) struct Ucmatose {
    recv: MemoryRegion,
    send: MemoryRegion,
    size: u32,
    count: u32,
}

impl Ucmatose {
    pub(super) fn new(q: &ConnQp, size: u32, count: u32) -> Result<Self> {
        let send = MemoryRegion::new(&q.dev, size as usize, Access::LOCAL_WRITE)?;
        let mut msg = Vec::with_capacity(size as usize);
        while msg.len() < size as usize {
            msg.extend_from_slice(format!("ibcm-msg-{} ", msg.len()).as_bytes());
        }
        msg.truncate(size as usize);
        send.write(0, &msg)?;
        Ok(Ucmatose {
            recv: MemoryRegion::new(&q.dev, size as usize, Access::LOCAL_WRITE)?,
            send,
            size,
            count,
        })
    }

    /// Posts `count` receives (ucmatose's `post_recvs`: all into one buffer).
    pub(super) fn post_recvs(&self, q: &ConnQp) -> Result<()> {
        for _ in 0..self.count {
            q.qp.post_recv(WR_RECV, &self.recv, 0, self.size)?;
        }
        Ok(())
    }

    fn send_all(&self, q: &ConnQp) -> Result<()> {
        for _ in 0..self.count {
            q.qp.post_send(WR_SEND, SendOp::Send, &self.send, 0, self.size)?;
        }
        Ok(())
    }

    /// Waits for `n` completions of `op`, each receive of exactly `size` bytes; returns the
    /// bytes received. SEND completions are counted when `op` is `Send`, else skipped.
    async fn wait_n(&self, q: &mut ConnQp, op: CompletionOp, mut sends: u32) -> Result<(u32, u64)> {
        let mut got = 0u32;
        let mut bytes = 0u64;
        while got < self.count || (op == CompletionOp::Recv && sends > 0) {
            let c = q.cq()?.next().await?;
            let Some(kind) = c.op else {
                bail!("work request {} failed: status {}", c.wr_id, c.status);
            };
            match kind {
                CompletionOp::Recv if c.byte_len != self.size => {
                    bail!("received {} bytes, want {}", c.byte_len, self.size)
                }
                CompletionOp::Recv if op == CompletionOp::Recv => {
                    got += 1;
                    bytes += u64::from(c.byte_len);
                }
                CompletionOp::Send if op == CompletionOp::Send => got += 1,
                CompletionOp::Send => sends = sends.saturating_sub(1),
                other => bail!("unexpected {other:?} completion"),
            }
        }
        Ok((sends, bytes))
    }

    /// The exchange; `Ok(bytes received)`, every message of the right length.
    pub(super) async fn exchange(&mut self, q: &mut ConnQp, server: bool) -> Result<u64> {
        if server {
            self.send_all(q)?;
            // Sends and receives complete in any order.
            let (_, bytes) = self.wait_n(q, CompletionOp::Recv, self.count).await?;
            Ok(bytes)
        } else {
            let (_, bytes) = self.wait_n(q, CompletionOp::Recv, 0).await?;
            self.send_all(q)?;
            self.wait_n(q, CompletionOp::Send, 0).await?;
            Ok(bytes)
        }
    }
}

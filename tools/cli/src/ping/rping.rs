//! rping's ping/pong on an RC QP (`librdmacm/examples/rping.c`), both roles.
//!
//! Per ping: the client SENDs the 16-byte `{be64 addr, be32 rkey, be32 size}` of its source
//! buffer; the server RDMA READs `size` bytes from it and SENDs a 16-byte go-ahead; the
//! client SENDs the same record for its sink buffer; the server RDMA WRITEs the data back
//! (the C string plus its NUL, as rping does) and SENDs a go-ahead. The client compares sink
//! and source, the server compares what it read with rping's pattern for that ping
//! ([`pattern`]): both sides verify the contents, as `rping -V` does.

use anyhow::{bail, Result};
use ibcm::rt::Connection;
use ibcm_xrc::verbs::rc::{Access, CompletionOp, MemoryRegion, SendOp};

use super::qp::{or_closed, ConnQp};

/// The size of rping's `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// rping's largest buffer (`RPING_BUFSIZE`, 64 KiB): what the server reads into.
const SERVER_BUF: usize = 64 * 1024;

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_RDMA: u64 = 3;

/// rping's data for ping number `ping` of `size` bytes: `rdma-ping-<ping>: `, then the
/// letters `A`..=`z` cycling from `A + ping % 58`, the last byte NUL.
pub(super) fn pattern(ping: u32, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size.saturating_sub(1));
    let mut c = 65 + (ping % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// `struct rping_rdma_info`: big-endian address, rkey, size.
fn info(addr: u64, rkey: u32, size: u32) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_info(b: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    let mut k = [0u8; 4];
    k.copy_from_slice(&b[8..12]);
    let mut s = [0u8; 4];
    s.copy_from_slice(&b[12..]);
    (
        u64::from_be_bytes(a),
        u32::from_be_bytes(k),
        u32::from_be_bytes(s),
    )
}

/// One connection's rping buffers.
pub(super) struct Rping {
    recv: MemoryRegion,
    send: MemoryRegion,
    /// Server: the RDMA sink and source. Client: the sink the server writes to.
    rdma: MemoryRegion,
    /// Client: the source the server reads from.
    start: Option<MemoryRegion>,
    size: usize,
}

impl Rping {
    pub(super) fn new(q: &ConnQp, size: u32, server: bool) -> Result<Self> {
        let size = size as usize;
        if !server && size < 24 {
            bail!("rping needs --size of at least 24 (its minimum)");
        }
        let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let rdma_len = if server { SERVER_BUF } else { size };
        Ok(Rping {
            recv: MemoryRegion::new(&q.dev, INFO_LEN, Access::LOCAL_WRITE)?,
            send: MemoryRegion::new(&q.dev, INFO_LEN, Access::LOCAL_WRITE)?,
            rdma: MemoryRegion::new(&q.dev, rdma_len, remote)?,
            start: if server {
                None
            } else {
                Some(MemoryRegion::new(&q.dev, size, remote)?)
            },
            size,
        })
    }

    pub(super) fn post_recvs(&self, q: &ConnQp) -> Result<()> {
        q.qp.post_recv(WR_RECV, &self.recv, 0, INFO_LEN as u32)?;
        Ok(())
    }

    /// Takes a received rping_rdma_info (checking its length) and re-posts the receive.
    fn take_info(&self, q: &ConnQp, byte_len: u32) -> Result<(u64, u32, u32)> {
        if byte_len as usize != INFO_LEN {
            bail!("received {byte_len} bytes, want an rping_rdma_info of {INFO_LEN}");
        }
        let mut b = [0u8; INFO_LEN];
        self.recv.read(0, &mut b)?;
        q.qp.post_recv(WR_RECV, &self.recv, 0, INFO_LEN as u32)?;
        Ok(parse_info(&b))
    }

    /// The server: answers pings until the client disconnects. `Ok(bytes verified)`; at
    /// least one ping must have been answered.
    pub(super) async fn serve(&mut self, q: &mut ConnQp, conn: &Connection) -> Result<u64> {
        let mut verified = 0u64;
        let mut ping = 0u32;
        loop {
            // The client's source buffer, or the end of the connection.
            let recv = match or_closed(conn, q.cq()?.wait(&[CompletionOp::Recv])).await? {
                Ok(c) => c,
                Err(why) if ping > 0 => {
                    let _ = why;
                    return Ok(verified);
                }
                Err(why) => bail!("connection ended before the first ping ({why})"),
            };
            let byte_len = recv.first().map_or(0, |c| c.byte_len);
            let (addr, rkey, size) = self.take_info(q, byte_len)?;
            let len = size as usize;
            if len == 0 || len > self.rdma.len() {
                bail!(
                    "ping {ping}: the client advertises {size} bytes (buffer {})",
                    self.rdma.len()
                );
            }
            q.qp.post_send(
                WR_RDMA,
                SendOp::RdmaRead {
                    remote_addr: addr,
                    rkey,
                },
                &self.rdma,
                0,
                size,
            )?;
            closed_is_error(or_closed(conn, q.cq()?.wait(&[CompletionOp::RdmaRead])).await?)?;
            let mut got = vec![0u8; len];
            self.rdma.read(0, &mut got)?;
            if got != pattern(ping, len) {
                bail!("ping {ping}: the {len} bytes read are not rping's pattern");
            }
            verified += len as u64;
            // Go ahead: the client sends its sink.
            q.qp.post_send(WR_SEND, SendOp::Send, &self.send, 0, INFO_LEN as u32)?;
            let recv = closed_is_error(
                or_closed(
                    conn,
                    q.cq()?.wait(&[CompletionOp::Send, CompletionOp::Recv]),
                )
                .await?,
            )?;
            let byte_len = recv.get(1).map_or(0, |c| c.byte_len);
            let (addr, rkey, _) = self.take_info(q, byte_len)?;
            // rping writes the C string back with its NUL.
            let wlen = got.iter().position(|&b| b == 0).map_or(len, |n| n + 1);
            q.qp.post_send(
                WR_RDMA,
                SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey,
                },
                &self.rdma,
                0,
                wlen as u32,
            )?;
            closed_is_error(or_closed(conn, q.cq()?.wait(&[CompletionOp::RdmaWrite])).await?)?;
            q.qp.post_send(WR_SEND, SendOp::Send, &self.send, 0, INFO_LEN as u32)?;
            closed_is_error(or_closed(conn, q.cq()?.wait(&[CompletionOp::Send])).await?)?;
            ping = ping.wrapping_add(1);
        }
    }

    /// The client: `pings` pings, each verified when it comes back. `Ok(bytes verified)`.
    pub(super) async fn ping(&mut self, q: &mut ConnQp, pings: u32) -> Result<u64> {
        let Some(start) = self.start.clone() else {
            bail!("not a client");
        };
        let size = self.size as u32;
        let mut verified = 0u64;
        for ping in 0..pings {
            let data = pattern(ping, self.size);
            start.write(0, &data)?;
            self.rdma.write(0, &vec![0u8; self.size])?;
            self.send
                .write(0, &info(start.addr(), start.rkey(), size))?;
            q.qp.post_send(WR_SEND, SendOp::Send, &self.send, 0, INFO_LEN as u32)?;
            let c = q
                .cq()?
                .wait(&[CompletionOp::Send, CompletionOp::Recv])
                .await?;
            self.take_info(q, c.get(1).map_or(0, |c| c.byte_len))?;
            self.send
                .write(0, &info(self.rdma.addr(), self.rdma.rkey(), size))?;
            q.qp.post_send(WR_SEND, SendOp::Send, &self.send, 0, INFO_LEN as u32)?;
            let c = q
                .cq()?
                .wait(&[CompletionOp::Send, CompletionOp::Recv])
                .await?;
            self.take_info(q, c.get(1).map_or(0, |c| c.byte_len))?;
            let mut back = vec![0u8; self.size];
            self.rdma.read(0, &mut back)?;
            if back != data {
                let at = back
                    .iter()
                    .zip(&data)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                bail!("ping {ping}: data mismatch at byte {at}");
            }
            verified += u64::from(size);
        }
        Ok(verified)
    }
}

fn closed_is_error<T>(r: Result<T, ibcm::proto::ConnectionError>) -> Result<T> {
    r.map_err(|why| anyhow::anyhow!("connection ended during a ping ({why})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_rpings() {
        let p = pattern(0, 64);
        assert_eq!(&p[..14], b"rdma-ping-0: A");
        assert_eq!(p[14], b'B');
        assert_eq!((p.len(), p[63]), (64, 0));
        // the start letter advances per ping and wraps after 'z'
        // (the prefix "rdma-ping-N: " is 13 bytes for one digit)
        assert_eq!(pattern(57, 64)[14], b'z');
        assert_eq!(pattern(58, 64)[14], b'A');
        let long = pattern(1, 200);
        assert!(long[13..199].iter().all(|c| (65..=122).contains(c)));
        assert_eq!(long[13], b'B');
        assert_eq!(long[13 + 122 - 66], b'z');
        assert_eq!(long[13 + 122 - 66 + 1], b'A');
    }

    #[test]
    fn info_round_trips_big_endian() {
        let b = info(0x0102_0304_0506_0708, 0x1122_3344, 64);
        assert_eq!(&b[..4], &[1, 2, 3, 4]);
        assert_eq!(parse_info(&b), (0x0102_0304_0506_0708, 0x1122_3344, 64));
    }
}

//! What sysfs says about the port behind a umad device file: its link layer, LID, SM, GID 0
//! and P_Key 0 (`/sys/class/infiniband_mad/umadN/{ibdev,port}` name the device and port;
//! `/sys/class/infiniband/<dev>/ports/<port>/…` hold the attributes, as `ib_core` exports
//! them from the port's PortInfo and GID and P_Key tables).
//!
//! ```no_run
//! use ibcm::rt::umad::IbPort;
//! let port = IbPort::of_umad("/dev/infiniband/umad0")?;
//! if port.is_infiniband() {
//!     println!("LID {} SM at LID {}", port.lid, port.sm_lid);
//! }
//! # Ok::<(), ibcm::rt::UmadError>(())
//! ```

use std::fs;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use ibcm_mad::{Gid, Lid, Pkey};

use super::UmadError;

/// A port's link layer (sysfs `link_layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkLayer {
    /// Native InfiniBand: LIDs, a subnet manager, path records from the SA.
    InfiniBand,
    /// RoCE: GIDs are IP addresses, no LIDs, no SA.
    Ethernet,
}

/// The port behind a umad device file, as sysfs reports it when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbPort {
    /// The RDMA device (`ibdev`, e.g. `mlx5_0`).
    pub device: String,
    /// The port number on the device.
    pub port: u8,
    /// The link layer. A kernel too old to export `link_layer` has InfiniBand only.
    pub link_layer: LinkLayer,
    /// The port's base LID (0 until the SM has assigned one, and on RoCE).
    pub lid: Lid,
    /// LID Mask Control: the port answers `lid` to `lid + 2^lmc - 1`.
    pub lmc: u8,
    /// The master SM's LID: where the SA is.
    pub sm_lid: Lid,
    /// The SL to reach the SM with.
    pub sm_sl: u8,
    /// GID 0 (subnet prefix and port GUID on InfiniBand).
    pub gid: Gid,
    /// P_Key 0 of the port's table (the default partition's, normally 0xFFFF).
    pub pkey0: Pkey,
}

impl IbPort {
    /// Reads the port behind the umad device file `umad` (e.g. `/dev/infiniband/umad0`).
    ///
    /// # Errors
    /// [`UmadError::Sysfs`] when a file cannot be read or does not hold what it should.
    pub fn of_umad(umad: impl AsRef<Path>) -> Result<IbPort, UmadError> {
        let umad = umad.as_ref();
        let name = umad
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| bad(umad.to_path_buf(), "not a umad device path"))?;
        let mad_dir = Path::new("/sys/class/infiniband_mad").join(name);
        let device = read(&mad_dir.join("ibdev"))?;
        let port: u8 = num(&mad_dir.join("port"))?;
        let dir = Path::new("/sys/class/infiniband")
            .join(&device)
            .join("ports")
            .join(port.to_string());
        IbPort::read_dir(device, port, &dir)
    }

    /// Reads the attributes in `dir`, a port's sysfs directory.
    fn read_dir(device: String, port: u8, dir: &Path) -> Result<IbPort, UmadError> {
        let link_layer = match fs::read_to_string(dir.join("link_layer")) {
            Ok(s) if s.trim() == "Ethernet" => LinkLayer::Ethernet,
            Ok(s) if s.trim() == "InfiniBand" => LinkLayer::InfiniBand,
            Ok(s) => return Err(bad(dir.join("link_layer"), &format!("{:?}", s.trim()))),
            // Before link_layer was exported, every port was InfiniBand.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LinkLayer::InfiniBand,
            Err(source) => {
                return Err(UmadError::Sysfs {
                    path: dir.join("link_layer"),
                    what: source.to_string(),
                })
            }
        };
        let gid_path = dir.join("gids").join("0");
        let gid = read(&gid_path)?
            .parse::<Ipv6Addr>()
            .map(|a| Gid(a.octets()))
            .map_err(|e| bad(gid_path, &e.to_string()))?;
        Ok(IbPort {
            device,
            port,
            link_layer,
            lid: Lid(num(&dir.join("lid"))?),
            lmc: num(&dir.join("lid_mask_count"))?,
            sm_lid: Lid(num(&dir.join("sm_lid"))?),
            sm_sl: num(&dir.join("sm_sl"))?,
            gid,
            pkey0: Pkey(num(&dir.join("pkeys").join("0"))?),
        })
    }

    /// Whether the port is native InfiniBand (LID-routed, with an SA).
    pub fn is_infiniband(&self) -> bool {
        self.link_layer == LinkLayer::InfiniBand
    }
}

fn bad(path: PathBuf, what: &str) -> UmadError {
    UmadError::Sysfs {
        path,
        what: what.to_string(),
    }
}

fn read(path: &Path) -> Result<String, UmadError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| bad(path.to_path_buf(), &e.to_string()))
}

/// A number as sysfs writes it: decimal, or hex with `0x` (`lid`, `sm_lid`, P_Keys).
fn num<T: TryFrom<u64>>(path: &Path) -> Result<T, UmadError> {
    let s = read(path)?;
    let v = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|e| bad(path.to_path_buf(), &format!("{s:?}: {e}")))?;
    T::try_from(v).map_err(|_| bad(path.to_path_buf(), &format!("{s:?} out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the test's own under the temp dir, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn port_dir(files: &[(&str, &str)]) -> Dir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = Dir(std::env::temp_dir().join(format!("ibcm-port-{}-{n}", std::process::id())));
        let _ = fs::remove_dir_all(d.path());
        for (name, body) in files {
            let p = d.path().join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, body).unwrap();
        }
        d
    }

    const IB: &[(&str, &str)] = &[
        ("lid", "0x3\n"),
        ("lid_mask_count", "0\n"),
        ("sm_lid", "0x1\n"),
        ("sm_sl", "0\n"),
        ("gids/0", "fe80:0000:0000:0000:0002:c903:0000:0003\n"),
        ("pkeys/0", "0xffff\n"),
    ];

    #[test]
    fn an_ib_port_without_link_layer_is_infiniband() {
        let d = port_dir(IB);
        let p = IbPort::read_dir("ibsim0".into(), 1, d.path()).unwrap();
        assert!(p.is_infiniband());
        assert_eq!((p.lid, p.sm_lid, p.sm_sl, p.lmc), (Lid(3), Lid(1), 0, 0));
        assert_eq!(p.pkey0, Pkey(0xffff));
        assert_eq!(
            p.gid,
            Gid("fe80::2:c903:0:3".parse::<Ipv6Addr>().unwrap().octets())
        );
    }

    #[test]
    fn link_layer_is_read_and_nonsense_refused() {
        let mut files = IB.to_vec();
        files.push(("link_layer", "Ethernet\n"));
        let d = port_dir(&files);
        let p = IbPort::read_dir("rxe0".into(), 1, d.path()).unwrap();
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
        fs::write(d.path().join("link_layer"), "Token Ring\n").unwrap();
        let e = IbPort::read_dir("rxe0".into(), 1, d.path()).unwrap_err();
        assert!(e.to_string().contains("Token Ring"), "{e}");
    }

    #[test]
    fn a_missing_or_bad_attribute_names_its_file() {
        let d = port_dir(&IB[1..]);
        let e = IbPort::read_dir("x".into(), 1, d.path()).unwrap_err();
        assert!(e.to_string().contains("/lid"), "{e}");
        let mut files = IB.to_vec();
        files[0] = ("lid", "0x10000\n");
        let d = port_dir(&files);
        let e = IbPort::read_dir("x".into(), 1, d.path()).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}

//! Open code enums: every raw value maps to a named variant or to `Unknown(raw)`, so an
//! unknown code never fails a parse (docs/wire.md §1, §2, §4.1).

use core::fmt;

macro_rules! open_enum {
    (
        $(#[$m:meta])*
        pub enum $name:ident($repr:ty) {
            $( $(#[$vm:meta])* $variant:ident = $value:expr => $label:literal, )*
        }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $( $(#[$vm])* $variant, )*
            /// A value this crate has no name for; the raw value is kept.
            Unknown($repr),
        }

        impl $name {
            /// The raw wire value.
            #[inline]
            pub const fn raw(self) -> $repr {
                match self {
                    $( $name::$variant => $value, )*
                    $name::Unknown(v) => v,
                }
            }

            /// Maps a raw wire value to its variant.
            #[inline]
            pub const fn from_raw(v: $repr) -> Self {
                match v {
                    $( $value => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }

            /// The spec's name for this code (`"unknown"` for [`Self::Unknown`]).
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $label, )*
                    $name::Unknown(_) => "unknown",
                }
            }

            /// Whether this is a named code.
            pub const fn is_known(self) -> bool {
                !matches!(self, $name::Unknown(_))
            }
        }

        impl From<$repr> for $name {
            #[inline]
            fn from(v: $repr) -> Self {
                Self::from_raw(v)
            }
        }

        impl From<$name> for $repr {
            #[inline]
            fn from(v: $name) -> Self {
                v.raw()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $( $name::$variant => f.write_str(stringify!($variant)), )*
                    $name::Unknown(v) => write!(f, "Unknown({v:#x})"),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $name::Unknown(v) => write!(f, "unknown ({v})"),
                    other => f.write_str(other.name()),
                }
            }
        }
    };
}

/// A branch-free `from_raw_lut` for open enums with a `u8` representation: a 256-entry table
/// built at compile time from `from_raw`. The message parsers use it; a `match` with a
/// catch-all compiles to a jump table per field.
macro_rules! u8_lut {
    ($($name:ident),* $(,)?) => {$(
        impl $name {
            /// [`Self::from_raw`] through a compile-time table (no branches).
            // A u8 always indexes a 256-entry table in bounds.
            #[allow(clippy::indexing_slicing)]
            #[inline(always)]
            pub(crate) const fn from_raw_lut(v: u8) -> Self {
                const LUT: [$name; 256] = {
                    let mut t = [$name::Unknown(0); 256];
                    let mut i = 0;
                    while i < 256 {
                        t[i] = $name::from_raw(i as u8);
                        i += 1;
                    }
                    t
                };
                LUT[v as usize]
            }
        }
    )*};
}

/// `impl Default` for an open enum (not derivable through the macro).
macro_rules! default_variant {
    ($name:ident, $variant:ident) => {
        #[allow(clippy::derivable_impls)]
        impl Default for $name {
            fn default() -> Self {
                $name::$variant
            }
        }
    };
}

open_enum! {
    /// MAD management class (byte 1 of the common header).
    pub enum MgmtClass(u8) {
        /// Subnet management, LID-routed.
        SubnLid = 0x01 => "SubnMgmt(LID-routed)",
        /// Subnet administration.
        SubnAdm = 0x03 => "SubnAdm",
        /// Performance management.
        Perf = 0x04 => "PerfMgmt",
        /// Baseboard management.
        BaseboardMgmt = 0x05 => "BMgmt",
        /// Device management.
        DevMgmt = 0x06 => "DevMgmt",
        /// Communication management (this crate's subject).
        Cm = 0x07 => "CM",
        /// SNMP tunnelling.
        Snmp = 0x08 => "SNMP",
        /// Subnet management, directed route.
        SubnDirected = 0x81 => "SubnMgmt(directed-route)",
    }
}

open_enum! {
    /// MAD method, including the response bit 0x80 (byte 3 of the common header).
    pub enum Method(u8) {
        /// Get.
        Get = 0x01 => "Get",
        /// Set.
        Set = 0x02 => "Set",
        /// Send: the only method CM messages use.
        Send = 0x03 => "Send",
        /// Trap.
        Trap = 0x05 => "Trap",
        /// Report.
        Report = 0x06 => "Report",
        /// TrapRepress.
        TrapRepress = 0x07 => "TrapRepress",
        /// GetResp.
        GetResp = 0x81 => "GetResp",
        /// ReportResp.
        ReportResp = 0x86 => "ReportResp",
    }
}

open_enum! {
    /// CM attribute IDs (docs/wire.md §2).
    pub enum AttrId(u16) {
        /// ClassPortInfo (0x0001).
        ClassPortInfo = 0x0001 => "CPI",
        /// Connect Request.
        Req = 0x0010 => "REQ",
        /// Message Receipt Acknowledgement.
        Mra = 0x0011 => "MRA",
        /// Connect Reject.
        Rej = 0x0012 => "REJ",
        /// Connect Reply.
        Rep = 0x0013 => "REP",
        /// Ready To Use.
        Rtu = 0x0014 => "RTU",
        /// Disconnect Request.
        Dreq = 0x0015 => "DREQ",
        /// Disconnect Reply.
        Drep = 0x0016 => "DREP",
        /// Service ID Resolution Request.
        SidrReq = 0x0017 => "SIDR_REQ",
        /// Service ID Resolution Response.
        SidrRep = 0x0018 => "SIDR_REP",
        /// Load Alternate Path.
        Lap = 0x0019 => "LAP",
        /// Alternate Path Response.
        Apr = 0x001a => "APR",
    }
}

open_enum! {
    /// REJ reason (`enum ib_cm_rej_reason`, docs/wire.md §4.1).
    pub enum RejReason(u16) {
        /// 1.
        NoQp = 1 => "no QP available",
        /// 2.
        NoEec = 2 => "no EEC available",
        /// 3.
        NoResources = 3 => "no resources",
        /// 4: the ARI carries the rejecting CA's GUID.
        Timeout = 4 => "timeout",
        /// 5.
        UnsupportedReq = 5 => "unsupported request",
        /// 6.
        InvalidCommId = 6 => "invalid communication ID",
        /// 7.
        InvalidCommInstance = 7 => "invalid communication instance",
        /// 8: nobody listens on the Service ID.
        InvalidServiceId = 8 => "invalid service ID",
        /// 9.
        InvalidTransportType = 9 => "invalid transport service type",
        /// 10.
        StaleConn = 10 => "stale connection",
        /// 11.
        RdcNotExist = 11 => "RDC does not exist",
        /// 12.
        InvalidGid = 12 => "invalid primary GID",
        /// 13.
        InvalidLid = 13 => "invalid primary LID",
        /// 14.
        InvalidSl = 14 => "invalid SL",
        /// 15.
        InvalidTrafficClass = 15 => "invalid traffic class",
        /// 16.
        InvalidHopLimit = 16 => "invalid hop limit",
        /// 17.
        InvalidPacketRate = 17 => "invalid packet rate",
        /// 18.
        InvalidAltGid = 18 => "invalid alternate GID",
        /// 19.
        InvalidAltLid = 19 => "invalid alternate LID",
        /// 20.
        InvalidAltSl = 20 => "invalid alternate SL",
        /// 21.
        InvalidAltTrafficClass = 21 => "invalid alternate traffic class",
        /// 22.
        InvalidAltHopLimit = 22 => "invalid alternate hop limit",
        /// 23.
        InvalidAltPacketRate = 23 => "invalid alternate packet rate",
        /// 24.
        PortCmRedirect = 24 => "port and CM redirect",
        /// 25.
        PortRedirect = 25 => "port redirect",
        /// 26.
        InvalidMtu = 26 => "invalid path MTU",
        /// 27.
        InsufficientRespRes = 27 => "insufficient responder resources",
        /// 28: the application (or rdma_cm on its behalf) refused.
        ConsumerReject = 28 => "consumer defined",
        /// 29.
        InvalidRnrRetry = 29 => "invalid RNR NAK retry count",
        /// 30.
        DuplicateLocalCommId = 30 => "duplicate local comm ID",
        /// 31.
        InvalidClassVersion = 31 => "unsupported class version",
        /// 32.
        InvalidFlowLabel = 32 => "invalid primary flow label",
        /// 33.
        InvalidAltFlowLabel = 33 => "invalid alternate flow label",
        /// 35: ECE vendor option not supported (Linux ≥ 5.8).
        VendorOptionNotSupported = 35 => "vendor option not supported",
    }
}

open_enum! {
    /// Which message an MRA acknowledges or a REJ rejects (2-bit field).
    pub enum MsgKind(u8) {
        /// A REQ.
        Req = 0 => "REQ",
        /// A REP.
        Rep = 1 => "REP",
        /// Anything else (LAP for MRA).
        Other = 2 => "other",
    }
}

default_variant!(MsgKind, Req);

open_enum! {
    /// REQ Transport Service Type (2-bit field, docs/wire.md §2.1, §3.1).
    pub enum TransportType(u8) {
        /// Reliable connected.
        Rc = 0 => "RC",
        /// Unreliable connected.
        Uc = 1 => "UC",
        /// Reliable datagram.
        Rd = 2 => "RD",
        /// Extended: see Extended Transport Type (XRC when that is 1).
        Extended = 3 => "extended",
    }
}

open_enum! {
    /// REQ Extended Transport Type (3-bit field).
    pub enum ExtTransportType(u8) {
        /// No extended transport.
        None = 0 => "none",
        /// eXtended Reliable Connected.
        Xrc = 1 => "XRC",
    }
}

open_enum! {
    /// Path MTU (4-bit field; `enum ib_mtu`).
    pub enum Mtu(u8) {
        /// 256 bytes.
        Mtu256 = 1 => "256",
        /// 512 bytes.
        Mtu512 = 2 => "512",
        /// 1024 bytes.
        Mtu1024 = 3 => "1024",
        /// 2048 bytes.
        Mtu2048 = 4 => "2048",
        /// 4096 bytes.
        Mtu4096 = 5 => "4096",
    }
}

impl Mtu {
    /// The MTU in bytes, if known.
    pub const fn bytes(self) -> Option<u32> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }
}

open_enum! {
    /// Static rate / packet rate (6-bit field; `enum ib_rate`).
    pub enum Rate(u8) {
        /// Port's current rate (Linux-only meaning of 0).
        PortCurrent = 0 => "port current",
        /// 2.5 Gb/s.
        G2_5 = 2 => "2.5 Gb/s",
        /// 10 Gb/s.
        G10 = 3 => "10 Gb/s",
        /// 30 Gb/s.
        G30 = 4 => "30 Gb/s",
        /// 5 Gb/s.
        G5 = 5 => "5 Gb/s",
        /// 20 Gb/s.
        G20 = 6 => "20 Gb/s",
        /// 40 Gb/s.
        G40 = 7 => "40 Gb/s",
        /// 60 Gb/s.
        G60 = 8 => "60 Gb/s",
        /// 80 Gb/s.
        G80 = 9 => "80 Gb/s",
        /// 120 Gb/s.
        G120 = 10 => "120 Gb/s",
        /// 14 Gb/s.
        G14 = 11 => "14 Gb/s",
        /// 56 Gb/s.
        G56 = 12 => "56 Gb/s",
        /// 112 Gb/s.
        G112 = 13 => "112 Gb/s",
        /// 168 Gb/s.
        G168 = 14 => "168 Gb/s",
        /// 25 Gb/s.
        G25 = 15 => "25 Gb/s",
        /// 100 Gb/s.
        G100 = 16 => "100 Gb/s",
        /// 200 Gb/s.
        G200 = 17 => "200 Gb/s",
        /// 300 Gb/s.
        G300 = 18 => "300 Gb/s",
        /// 28 Gb/s.
        G28 = 19 => "28 Gb/s",
        /// 50 Gb/s.
        G50 = 20 => "50 Gb/s",
        /// 400 Gb/s.
        G400 = 21 => "400 Gb/s",
        /// 600 Gb/s.
        G600 = 22 => "600 Gb/s",
    }
}

open_enum! {
    /// REP Failover Accepted (2-bit field).
    pub enum FailoverAccepted(u8) {
        /// Failover accepted (alternate path loaded).
        Accepted = 0 => "accepted",
        /// Failover not accepted.
        Rejected = 1 => "rejected",
        /// Failover not supported.
        Unsupported = 2 => "unsupported",
    }
}

open_enum! {
    /// APR AP Status (`enum ib_cm_apr_status`).
    pub enum AprStatus(u8) {
        /// 0: alternate path loaded.
        Success = 0 => "success",
        /// 1.
        InvalidCommId = 1 => "invalid comm ID",
        /// 2.
        Unsupported = 2 => "unsupported request",
        /// 3.
        Rejected = 3 => "rejected",
        /// 4.
        Redirect = 4 => "redirect",
        /// 5.
        IsCurrent = 5 => "is current path",
        /// 6.
        InvalidQpnEecn = 6 => "invalid QPN/EECN",
        /// 7.
        InvalidLid = 7 => "invalid LID",
        /// 8.
        InvalidGid = 8 => "invalid GID",
        /// 9.
        InvalidFlowLabel = 9 => "invalid flow label",
        /// 10.
        InvalidTrafficClass = 10 => "invalid traffic class",
        /// 11.
        InvalidHopLimit = 11 => "invalid hop limit",
        /// 12.
        InvalidPacketRate = 12 => "invalid packet rate",
        /// 13.
        InvalidSl = 13 => "invalid SL",
    }
}

open_enum! {
    /// SIDR_REP Status (`enum ib_cm_sidr_status`).
    pub enum SidrStatus(u8) {
        /// 0: the QPN/Q_Key are valid.
        Success = 0 => "success",
        /// 1: nobody serves this Service ID.
        UnsupportedServiceId = 1 => "service ID not supported",
        /// 2.
        Rejected = 2 => "rejected by consumer",
        /// 3.
        NoQp = 3 => "no QP",
        /// 4: the additional information is a ClassPortInfo.
        Redirect = 4 => "redirect",
        /// 5.
        UnsupportedVersion = 5 => "unsupported class version",
    }
}

default_variant!(TransportType, Rc);

default_variant!(ExtTransportType, None);

default_variant!(Rate, PortCurrent);

default_variant!(FailoverAccepted, Accepted);

default_variant!(AprStatus, Success);

default_variant!(SidrStatus, Success);

impl Default for Mtu {
    /// 1024 bytes, the usual RoCE value.
    fn default() -> Self {
        Mtu::Mtu1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_tables_equal_the_matches() {
        for v in 0..=u8::MAX {
            assert_eq!(MgmtClass::from_raw_lut(v), MgmtClass::from_raw(v));
            assert_eq!(Method::from_raw_lut(v), Method::from_raw(v));
            assert_eq!(MsgKind::from_raw_lut(v), MsgKind::from_raw(v));
            assert_eq!(TransportType::from_raw_lut(v), TransportType::from_raw(v));
            assert_eq!(
                ExtTransportType::from_raw_lut(v),
                ExtTransportType::from_raw(v)
            );
            assert_eq!(Mtu::from_raw_lut(v), Mtu::from_raw(v));
            assert_eq!(Rate::from_raw_lut(v), Rate::from_raw(v));
            assert_eq!(
                FailoverAccepted::from_raw_lut(v),
                FailoverAccepted::from_raw(v)
            );
            assert_eq!(AprStatus::from_raw_lut(v), AprStatus::from_raw(v));
            assert_eq!(SidrStatus::from_raw_lut(v), SidrStatus::from_raw(v));
        }
    }

    #[test]
    fn round_trip_every_value() {
        for v in 0..=u8::MAX {
            assert_eq!(Method::from_raw(v).raw(), v);
            assert_eq!(Rate::from_raw(v).raw(), v);
            assert_eq!(MgmtClass::from_raw(v).raw(), v);
        }
        for v in 0..=u16::MAX {
            assert_eq!(AttrId::from_raw(v).raw(), v);
            assert_eq!(RejReason::from_raw(v).raw(), v);
        }
    }

    #[test]
    fn names() {
        assert_eq!(RejReason::from_raw(28), RejReason::ConsumerReject);
        assert_eq!(RejReason::from_raw(34), RejReason::Unknown(34));
        assert_eq!(RejReason::ConsumerReject.to_string(), "consumer defined");
        assert_eq!(AttrId::from_raw(0x1a).name(), "APR");
        assert_eq!(Mtu::Mtu1024.bytes(), Some(1024));
    }
}

u8_lut!(
    MgmtClass,
    Method,
    MsgKind,
    TransportType,
    ExtTransportType,
    Mtu,
    Rate,
    FailoverAccepted,
    AprStatus,
    SidrStatus,
);

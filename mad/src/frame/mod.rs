//! Packet framing around a MAD (placeholder, being written).

/// Frame decoding error (placeholder).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Placeholder.
    #[error("placeholder")]
    Placeholder,
}

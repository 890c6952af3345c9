//! Capture files (placeholder, being written).

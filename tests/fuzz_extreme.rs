//! Extreme sizes (work in progress).

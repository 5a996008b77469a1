//! Sampler (in progress).

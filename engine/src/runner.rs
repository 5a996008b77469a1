//! Runner (in progress).

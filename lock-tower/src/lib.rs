//! lock-tower: serialize requests by key (filled in by the tower issue).
#![forbid(unsafe_code)]

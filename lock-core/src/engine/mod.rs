//! The engine above the backends: acquisition and waiting (with the local hand-off between a
//! process's tasks), the held state of each lock, the watchdog that renews leases, and the
//! task scopes of reentrancy. It talks to a store only through the
//! [`Backend`](crate::backend::Backend) trait; no backend imports it.

pub(crate) mod acquire;
pub(crate) mod held;
pub(crate) mod scope;
pub(crate) mod wait;
pub(crate) mod watchdog;
pub(crate) mod watched;

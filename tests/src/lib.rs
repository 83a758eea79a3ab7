//! The redis-server test harness.

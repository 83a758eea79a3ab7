//! Compile-time behaviour of `#[distributed_lock]`: every supported form compiles (and runs),
//! every misuse fails with the message in the `.stderr` golden next to it.
//!
//! After an intended change of a message: `TRYBUILD=overwrite cargo test -p lock-macros --test ui`,
//! then read every changed golden.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

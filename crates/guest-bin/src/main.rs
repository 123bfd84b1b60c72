//! The guest binary: see the library ([`hako_guest_bin::main`]), which
//! `hako` also runs when started as `hako-guest`.

// Started for every container sandbox: its entry point skips Rust's
// runtime start-up, as `hako`'s does (see `hako_sys::start`).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
hako_sys::entry_point!(run);
// A test build has the test harness's entry point instead.
#[cfg(test)]
const _: fn() -> u8 = run;

/// Everything the guest does: its exit code.
fn run() -> u8 {
    hako_guest_bin::main()
}

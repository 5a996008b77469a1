//! Bytes → GGUF → model config → weight mapping → a 2-token forward, or an error.
//! Any panic, abort, timeout or oversized allocation is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = pn_engine::Gguf::from_bytes(data.to_vec()) else { return };
    let Ok(model) = pn_models::load(&g) else { return };
    let Ok(runner) = pn_engine::Runner::new(model, Arc::new(g), Arc::new(pn_cpu::CpuBackend::new(1))) else { return };
    let mut st = runner.new_state(16);
    let _ = runner.forward(&mut st, &[0, 1], false);
});

//! Bytes → `Gguf::from_bytes` only (no model load, no forward: the `gguf_model` target
//! does those at ~100 execs/s; this one reaches millions). On success every tensor's
//! byte range must lie inside the file and every metadata value must describe itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = pn_engine::Gguf::from_bytes(data.to_vec()) else { return };
    let len = g.file_bytes().len() as u64;
    for t in &g.tensors {
        let end = g.data_start.checked_add(t.offset).and_then(|o| o.checked_add(t.n_bytes));
        assert!(end.is_some_and(|e| e <= len), "tensor {} ends past the file ({len} bytes)", t.name);
        assert_eq!(g.try_tensor_bytes(t).map(|b| b.len() as u64), Some(t.n_bytes), "tensor {}", t.name);
        assert!(g.tensor(&t.name).is_some());
    }
    for (k, v) in &g.metadata {
        let _ = v.describe();
        assert!(g.get(k).is_some());
    }
    let _ = g.arch();
});

//! `Gguf::open_with`: a copy into (huge-page) anonymous memory and the memory map hold the
//! same bytes and give the same logits; `auto` picks one of them; bad input is an error.

use pn_cpu::CpuBackend;
use pn_engine::{Gguf, LoadMode, Runner};
use pn_tests::fixture;
use std::sync::Arc;

fn logits(g: Gguf) -> Vec<f32> {
    let g = Arc::new(g);
    let m = pn_models::load(&g).expect("fixture model loads");
    let r = Runner::new(m, g, Arc::new(CpuBackend::new(2))).expect("runner builds");
    let mut st = r.new_state(64);
    let mut out = r.forward(&mut st, &[1, 2, 3, 4, 5], true).unwrap().data;
    out.extend(r.forward(&mut st, &[6], false).unwrap().data);
    out
}

#[test]
fn copy_and_mmap_load_the_same_model() {
    let path = fixture("ktiny-q4_k_m.gguf");
    let on_disk = std::fs::read(&path).unwrap();
    let mut runs = Vec::new();
    for mode in [LoadMode::Mmap, LoadMode::Copy, LoadMode::Auto] {
        let g = Gguf::open_with(&path, mode).expect("opens");
        assert!(g.is_mmapped(), "{mode:?}: a mapping (of the file or of anonymous memory)");
        assert_eq!(g.file_bytes(), &on_disk[..], "{mode:?}: the file's bytes");
        runs.push(logits(g));
    }
    assert_eq!(runs[0], runs[1], "copy vs mmap logits");
    assert_eq!(runs[0], runs[2], "auto vs mmap logits");
}

#[test]
fn load_modes_parse_and_reject_bad_input() {
    assert_eq!("copy".parse::<LoadMode>(), Ok(LoadMode::Copy));
    assert_eq!("mmap".parse::<LoadMode>(), Ok(LoadMode::Mmap));
    assert_eq!("auto".parse::<LoadMode>(), Ok(LoadMode::Auto));
    assert!("huge".parse::<LoadMode>().unwrap_err().contains("expected auto, mmap or copy"));
    let missing = fixture("no-such-model.gguf");
    assert!(Gguf::open_with(&missing, LoadMode::Copy).is_err());
    // a truncated file is a parse error whichever way it was loaded
    let dir = std::env::temp_dir().join(format!("pn-load-modes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.gguf");
    let bytes = std::fs::read(fixture("ktiny-q4_k_m.gguf")).unwrap();
    std::fs::write(&cut, &bytes[..100]).unwrap();
    for mode in [LoadMode::Mmap, LoadMode::Copy] {
        assert!(Gguf::open_with(&cut, mode).is_err(), "{mode:?}: truncated file accepted");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn copy_reports_bytes_read_and_mmap_reads_nothing() {
    let path = fixture("ktiny-q4_k_m.gguf");
    let len = std::fs::metadata(&path).unwrap().len();
    let mut calls: Vec<(u64, u64)> = Vec::new();
    let g = Gguf::open_with_progress(&path, LoadMode::Copy, &mut |done, total| calls.push((done, total))).expect("opens");
    assert_eq!(g.file_bytes().len() as u64, len);
    assert_eq!(calls.last(), Some(&(len, len)), "the last report is the whole file: {calls:?}");
    assert!(calls.windows(2).all(|w| w[0].0 < w[1].0), "bytes read only grow: {calls:?}");
    let mut mapped = 0;
    Gguf::open_with_progress(&path, LoadMode::Mmap, &mut |_, _| mapped += 1).expect("opens");
    assert_eq!(mapped, 0, "a memory map reads nothing up front");
}

/// A mapped file's weights without a `rows16` copy get plain copies holding their exact
/// bytes (once: a second call copies nothing); a file already in anonymous memory gets
/// none; a runner on the mapped file makes them at its first plan and its logits are
/// those of the copy in anonymous memory (above).
#[test]
fn plain_copies_hold_the_files_bytes() {
    let path = fixture("ktiny-q4_k_m.gguf");
    let g = Gguf::open_with(&path, LoadMode::Mmap).expect("opens");
    let all: Vec<usize> = (0..g.tensors.len()).collect();
    let before: Vec<Vec<u8>> = g.tensors.iter().map(|t| g.tensor_bytes(t).to_vec()).collect();
    let copied = g.prepare_plain_copies(&all);
    let expect: u64 = g.tensors.iter().enumerate().filter(|(ix, _)| g.rows16(*ix).is_none()).map(|(_, t)| t.n_bytes).sum();
    assert!(copied >= expect && expect > 0, "copied {copied} bytes, the tensors hold {expect}");
    assert_eq!(g.prepare_plain_copies(&all), 0, "a second call copies nothing");
    for (ix, t) in g.tensors.iter().enumerate() {
        let host = g.host_bytes(ix).expect("a tensor of the file");
        assert_eq!(host, &before[ix][..], "{}: the file's bytes", t.name);
        assert_ne!(host.as_ptr(), g.tensor_bytes(t).as_ptr(), "{}: a copy, not the mapping", t.name);
        assert_eq!(host.as_ptr() as usize % 64, 0, "{}: 64-byte aligned", t.name);
    }
    assert_eq!(g.host_bytes(g.tensors.len()), None, "no such tensor");
    let anon = Gguf::open_with(&path, LoadMode::Copy).expect("opens");
    assert_eq!(anon.prepare_plain_copies(&all), 0, "a file in anonymous memory is not copied again");
    assert_eq!(anon.host_bytes(0).map(<[u8]>::as_ptr), Some(anon.tensor_bytes(&anon.tensors[0]).as_ptr()));
}

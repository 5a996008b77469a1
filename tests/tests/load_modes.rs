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

/// The `rows16` copies: an expert stack's copy holds all its rows; a matrix whose rows
/// are not whole 16-row groups (the fixture's 1027-row LM head) gets a copy of its first
/// 1024 rows, its last 3 read from the file — and the logits are the copy-free load's.
#[test]
fn rows16_copies_cover_whole_16_row_groups() {
    let path = fixture("ktiny-q4_k_m.gguf");
    let g = Gguf::open_with(&path, LoadMode::Mmap).expect("opens");
    if !pn_ops::quant::rows16::available(pn_ops::GgmlType::Q6K, 256, 16) {
        return; // no interleaved layout on this CPU: nothing to check
    }
    let all: Vec<usize> = (0..g.tensors.len()).collect();
    assert!(g.prepare_rows16(&all) > 0, "copies made");
    let find = |name: &str| g.tensors.iter().position(|t| t.name == name).expect(name);
    let head = &g.tensors[find("output.weight")];
    let (k, rows) = (head.ne[0] as usize, head.ne[1] as usize);
    assert_eq!((rows % 16, head.ty), (3, pn_ops::GgmlType::Q6K), "the fixture's LM head: 1027 Q6_K rows");
    let rb = head.ty.row_bytes(k).unwrap();
    let copy = g.rows16(find("output.weight")).expect("the LM head's whole 16-row groups are copied");
    assert_eq!(copy.len(), rows / 16 * 16 * rb, "its first {} rows", rows / 16 * 16);
    let mut want = vec![0u8; copy.len()];
    assert!(pn_ops::quant::rows16::repack(head.ty, k, rows / 16 * 16, &g.tensor_bytes(head)[..copy.len()], &mut want));
    assert!(copy == &want[..], "the copy is those rows interleaved");
    let exps = find("blk.0.ffn_down_exps.weight");
    assert_eq!(g.rows16(exps).map(<[u8]>::len), Some(g.tensors[exps].n_bytes as usize), "a stack's copy holds every expert");
    // a runner reads the copies (and the LM head's last rows from the file): the logits
    // are those of the load that makes no copies
    let with = logits(Gguf::open_with(&path, LoadMode::Mmap).unwrap());
    let without = logits(Gguf::open_with(&path, LoadMode::Copy).unwrap());
    assert_eq!(with.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), without.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
}

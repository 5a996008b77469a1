//! Tokenizer throughput on one core.
//!
//! `cargo run --release -p pn-engine --example tokenizer_bench [-- FILE...]`
//! Encodes the given English text files (default: the repository's Markdown files) with
//! the Qwen3.5 vocabulary fixture and prints MB/s: the first pass (per-word cache cold),
//! the steady state (cache warm), and a text of random letter words that defeats the
//! cache.

use pn_engine::tokenizer::Tokenizer;
use pn_engine::Gguf;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn md_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() && !name.starts_with('.') && name != "target" {
            md_files(&p, out);
        } else if name.ends_with(".md") {
            out.push(p);
        }
    }
}

fn mbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let t0 = Instant::now();
    let g = Gguf::open(&root.join("tests/fixtures/qwen35-vocab.gguf")).expect("vocab fixture");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    println!(
        "load: {:.0} ms ({} tokens)",
        t0.elapsed().as_secs_f64() * 1e3,
        tok.n_vocab()
    );

    let mut files: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if files.is_empty() {
        md_files(&root, &mut files);
    }
    let text: String = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!text.is_empty(), "no input text");

    let t = Instant::now();
    let n_tok = tok.encode(&text, false).len();
    let cold = t.elapsed().as_secs_f64();
    println!(
        "cold: {:.1} MB/s ({} bytes -> {} tokens, {:.2} bytes/token)",
        mbps(text.len(), cold),
        text.len(),
        n_tok,
        text.len() as f64 / n_tok as f64
    );

    let (mut bytes, t) = (0usize, Instant::now());
    while t.elapsed().as_secs_f64() < 2.0 {
        std::hint::black_box(tok.encode(&text, false));
        bytes += text.len();
    }
    println!("warm: {:.1} MB/s", mbps(bytes, t.elapsed().as_secs_f64()));

    // Random lowercase words (almost every word is new to the cache).
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut rand_text = String::new();
    while rand_text.len() < 4_000_000 {
        let len = 2 + next() % 9;
        for _ in 0..len {
            rand_text.push((b'a' + (next() % 26) as u8) as char);
        }
        rand_text.push(if next() % 12 == 0 { '.' } else { ' ' });
    }
    let t = Instant::now();
    let n = tok.encode(&rand_text, false).len();
    println!(
        "random words: {:.1} MB/s ({} tokens)",
        mbps(rand_text.len(), t.elapsed().as_secs_f64()),
        n
    );
}

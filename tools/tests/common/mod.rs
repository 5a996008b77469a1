//! Helpers shared by the `pn` integration tests: fixture paths, scratch paths, and the
//! outcome of one run.
#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/NAME` of the repository.
pub fn fx(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name).display().to_string()
}

/// `NAME` in this test file's own folder under CARGO_TARGET_TMPDIR.
pub fn tmp_in(dir: &str, name: &str) -> String {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&d).unwrap();
    d.join(name).display().to_string()
}

/// Exit code and output of one `pn` run.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

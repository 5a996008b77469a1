//! Output plumbing shared by every command: `-` for stdin/stdout, output files checked
//! before the model loads, a broken pipe that ends the command quietly, and errors that
//! always start on their own line.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// True while stdout holds a line without its newline (streamed text): an error printed
/// on stderr then starts with a newline instead of being glued to that text.
static LINE_OPEN: AtomicBool = AtomicBool::new(false);

/// Write `text` to stdout now (flushed), remembering whether it ended the line.
pub fn print(out: &mut impl Write, text: &str) -> Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    out.write_all(text.as_bytes())?;
    out.flush()?;
    LINE_OPEN.store(!text.ends_with('\n'), Ordering::Relaxed);
    Ok(())
}

/// Whether `e` is (caused by) a write to a closed pipe (`pn run | head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// The error chain as one line, each cause once: a cause whose text its parent already
/// ends with (a `#[error("x: {0}")]` variant that also names its `#[source]`) is skipped.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Print the error (`error: ...`) on its own line of stderr.
pub fn report_error(e: &anyhow::Error) {
    let _ = std::io::stdout().flush();
    let nl = if LINE_OPEN.load(Ordering::Relaxed) { "\n" } else { "" };
    eprintln!("{nl}error: {}", error_line(e));
}

/// Is `p` the `-` that means stdin or stdout?
pub fn is_dash(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// The whole of a file, or of stdin for `-`.
pub fn read_text(p: &Path, what: &str) -> Result<String> {
    if is_dash(p) {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).with_context(|| format!("{what}: cannot read stdin"))?;
        return Ok(s);
    }
    std::fs::read_to_string(p).with_context(|| format!("{what}: cannot read {}", p.display()))
}

/// An output file opened before the model loads (so a bad path fails first), removed
/// again if the command fails before [`OutFile::commit`]; `-` is stdout.
pub struct OutFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    committed: bool,
}

impl OutFile {
    pub fn create(path: &Path, what: &str) -> Result<OutFile> {
        if is_dash(path) {
            return Ok(OutFile { path: path.into(), file: None, committed: true });
        }
        if path.is_dir() {
            anyhow::bail!("{what}: cannot create {}: expected a file path, found a directory", path.display());
        }
        let file = std::fs::File::create(path).with_context(|| format!("{what}: cannot create {}", path.display()))?;
        Ok(OutFile { path: path.into(), file: Some(file), committed: false })
    }

    pub fn is_stdout(&self) -> bool {
        self.file.is_none()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write all of `bytes` and keep the file.
    pub fn commit(mut self, bytes: &[u8]) -> Result<()> {
        match &mut self.file {
            Some(f) => f.write_all(bytes).with_context(|| format!("cannot write {}", self.path.display()))?,
            None => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()?;
            }
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        if !self.committed {
            self.file = None;
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

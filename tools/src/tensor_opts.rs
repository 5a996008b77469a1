//! `--dump-tensors REGEX --dump-dir D`: record matching nodes while a command runs.

use anyhow::{Context, Result};
use pn_engine::tensor_dump::TensorRecorder;
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct DumpOpts {
    /// Write every node whose name matches this regex (e.g. 'blk\.3\..*' or 'l_out-.*') as .npy
    #[arg(long, requires = "dump_dir")]
    pub dump_tensors: Option<String>,
    /// Directory for --dump-tensors
    #[arg(long, requires = "dump_tensors")]
    pub dump_dir: Option<PathBuf>,
}

impl DumpOpts {
    pub fn recorder(&self) -> Result<Option<TensorRecorder>> {
        match &self.dump_tensors {
            None => Ok(None),
            Some(p) => Ok(Some(TensorRecorder::new(p).map_err(|e| anyhow::anyhow!("--dump-tensors: expected a regex, found {p:?}: {e}"))?)),
        }
    }

    /// Write what was recorded and print one summary line per node.
    pub fn finish(&self, rec: Option<TensorRecorder>) -> Result<()> {
        let (Some(rec), Some(dir)) = (rec, &self.dump_dir) else { return Ok(()) };
        for s in &rec.summaries {
            eprintln!("{s}");
        }
        let files = rec.write(dir).with_context(|| format!("cannot write tensors to {}", dir.display()))?;
        if files.is_empty() {
            eprintln!("warning: --dump-tensors matched no node (names look like attn_norm-3, l_out-0, result_output)");
        } else {
            eprintln!("wrote {} tensors to {}", files.len(), dir.display());
        }
        for s in &rec.skipped {
            eprintln!("warning: {s} changed shape between steps; only its first shape was kept");
        }
        Ok(())
    }
}

//! `--draft mtp|lookup|none --draft-n N` (docs/speculative.md): speculative decoding for
//! `pn run`, `chat`, `batch`, `bench`.

use crate::load::Loaded;
use anyhow::{Context, Result};
use pn_engine::spec::{Adaptive, DraftFactory, DraftKind, DraftPolicy, MtpModel, Speculator, MAX_DRAFT};
use std::sync::Arc;

#[derive(clap::Args, Clone, Debug)]
pub struct DraftOpts {
    /// Speculative decoding: draft tokens with the model's MTP block (mtp), by prompt
    /// lookup (lookup: n-gram matches in the context), or not at all (none)
    #[arg(long, default_value = "none", value_parser = parse_kind)]
    pub draft: DraftKind,
    /// Draft tokens per verify pass (1..=16; default 3 for lookup, 1 for mtp)
    #[arg(long = "draft-n", value_name = "N")]
    pub draft_n: Option<usize>,
    /// Which rounds draft: `adaptive` (where drafting measures faster than plain steps,
    /// per number of sequences in the round; the text is the same either way) or
    /// `always`
    #[arg(long = "draft-policy", default_value = "adaptive", value_parser = parse_policy)]
    pub draft_policy: DraftPolicy,
    /// A predicted output for `--draft lookup`: a text file the answer is expected to
    /// repeat (the file a code edit rewrites, a previous answer); drafts also come from
    /// n-gram matches in it
    #[arg(long = "draft-ref", value_name = "FILE")]
    pub draft_ref: Option<std::path::PathBuf>,
}

fn parse_policy(s: &str) -> Result<DraftPolicy, String> {
    s.parse()
}

/// `[draft mtp ×1 …: drafted …]`: the end-of-run line (with the adaptive policy, the
/// rounds that drafted).
pub fn end_line(kind: DraftKind, n: usize, adapt: Option<&Adaptive>, stats: &pn_engine::spec::SpecStats) -> String {
    let policy = adapt.map_or(String::new(), |a| format!(" (adaptive: {} of {} rounds drafted)", a.rounds[0], a.rounds[0] + a.rounds[1]));
    format!("[draft {kind} ×{n}{policy}: {}]", stats.line())
}

fn parse_kind(s: &str) -> Result<DraftKind, String> {
    s.parse()
}

impl DraftOpts {
    /// Checks the flags before the model loads.
    pub fn check(&self) -> Result<()> {
        if let Some(n) = self.draft_n {
            if n == 0 || n > MAX_DRAFT {
                anyhow::bail!("--draft-n: expected 1..={MAX_DRAFT} draft tokens, found {n}");
            }
            if self.draft == DraftKind::None {
                anyhow::bail!("--draft-n: needs --draft mtp or --draft lookup");
            }
        }
        if let Some(p) = &self.draft_ref {
            if self.draft != DraftKind::Lookup {
                anyhow::bail!("--draft-ref: needs --draft lookup (found --draft {})", self.draft);
            }
            if !p.is_file() {
                anyhow::bail!("--draft-ref: expected a readable text file, found {}", p.display());
            }
        }
        Ok(())
    }
    pub fn n(&self) -> usize {
        self.draft_n.unwrap_or(match self.draft {
            DraftKind::Mtp => 1,
            _ => 3,
        })
    }
    /// What makes each sequence's drafter (None for `--draft none`): loads and checks the
    /// MTP block once.
    pub fn factory(&self, l: &Loaded) -> Result<Option<DraftFactory>> {
        Ok(match self.draft {
            DraftKind::None => None,
            DraftKind::Lookup => Some(DraftFactory::Lookup),
            DraftKind::Mtp => {
                let block = pn_models::qwen35moe::mtp::load(&l.gguf).with_context(|| format!("--draft mtp with {}", l.name))?;
                let backend = l.runner.dies()[0].backend.clone();
                Some(DraftFactory::Mtp(Arc::new(MtpModel::new(block, l.gguf.clone(), backend))))
            }
        })
    }

    /// The tokens of `--draft-ref` (no special tokens), None without it.
    pub fn reference(&self, l: &Loaded) -> Result<Option<Arc<[u32]>>> {
        let Some(p) = &self.draft_ref else { return Ok(None) };
        let text = std::fs::read_to_string(p).with_context(|| format!("--draft-ref: cannot read {} as UTF-8 text", p.display()))?;
        Ok(Some(crate::load::tokenizer(l)?.encode(&text, false).into()))
    }

    /// The speculator of one sequence (None for `--draft none`).
    pub fn speculator(&self, l: &Loaded, max_seq: usize) -> Result<Option<Speculator>> {
        let Some(f) = self.factory(l)? else { return Ok(None) };
        let d = f.drafter_with(max_seq, self.reference(l)?.as_ref());
        Ok(Some(Speculator::new(&l.runner, d, self.n())?.with_policy(self.draft_policy)))
    }
}

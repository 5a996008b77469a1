//! `pn run`: generate text, streamed token by token.

use crate::generate::{self, Spec};
use crate::{load, output, prompt};
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::sampler::Sampler;

/// The prompt used when the built-in model runs without one.
const DEFAULT_PROMPT: &str = "def fibonacci(n):";

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    #[command(flatten)]
    dump: crate::tensor_opts::DumpOpts,
    #[command(flatten)]
    prompt: prompt::PromptOpts,
    /// Tokens to generate (-1: until end of text or a full context; 0: only read the prompt)
    #[arg(short = 'n', long = "n-predict", default_value_t = 128, allow_negative_numbers = true)]
    n: i64,
    /// Stop when the text contains this (repeatable); it is not printed
    #[arg(long = "stop", value_name = "STR", allow_hyphen_values = true)]
    stop: Vec<String>,
    #[command(flatten)]
    sampling: crate::sampling::SamplingOpts,
    #[command(flatten)]
    ctx: load::ContextOpts,
    #[command(flatten)]
    draft: crate::draft::DraftOpts,
    /// Do not stop at end-of-generation tokens
    #[arg(long)]
    ignore_eos: bool,
}

/// `-n`: -1 = no limit, otherwise a count ≥ 0.
pub fn token_limit(n: i64, allow_zero: bool) -> Result<Option<usize>> {
    match n {
        -1 => Ok(None),
        0 if !allow_zero => bail!("--n-predict (-n): expected at least 1 token, or -1 for no limit, found 0"),
        n if n < -1 => bail!("--n-predict (-n): expected a token count ≥ 0, or -1 for no limit, found {n}"),
        n => Ok(Some(n as usize)),
    }
}

pub fn run(a: RunArgs) -> Result<()> {
    // every flag and the prompt first: nothing waits for the model to fail
    let limit = token_limit(a.n, true)?;
    let stops = prompt::stops(&a.stop, a.prompt.escape)?;
    let is_default = a.opts.model.is_none();
    let cfg = a.sampling.config(is_default)?;
    let seed = cfg.seed;
    let kv_cfg = load::state_config(&a.opts, a.ctx.max_seq, None)?;
    let prompt = match (a.prompt.read()?, is_default) {
        (Some((p, _)), _) => p,
        (None, true) => DEFAULT_PROMPT.to_string(),
        (None, false) => bail!("--prompt: expected a prompt for --model (-p TEXT, -f FILE or text on stdin; only the built-in model has a default prompt)"),
    };
    load::check(&a.opts)?;
    a.draft.check()?;
    let mut rec = a.dump.recorder()?;
    if rec.is_some() && a.draft.draft != pn_engine::spec::DraftKind::None {
        bail!("--dump-tensors: not with --draft (a verify pass is not a decode step); use --draft none");
    }
    let l = load::load(&a.opts)?;
    let tok = load::tokenizer(&l)?;
    let max_seq = kv_cfg.max_seq;
    let ring = kv_cfg.overflow == pn_ops::Overflow::Ring;
    let mut ids = Vec::new();
    if tok.add_bos() {
        ids.extend(tok.bos());
    }
    ids.extend(tok.encode(&prompt, true));
    if ids.is_empty() {
        bail!("--prompt: the text tokenized to no tokens");
    }
    if !ring && ids.len() >= max_seq {
        bail!("the prompt has {} tokens but the context holds {max_seq} (raise --max-seq, or --context-overflow ring)", ids.len());
    }
    if let Some(n) = limit.filter(|&n| !ring && n > max_seq - ids.len() + 1) {
        eprintln!("warning: generating at most {} tokens, not {n}: the context holds {max_seq}", max_seq - ids.len() + 1);
    }
    let mut st = load::first_state(&l, &kv_cfg)?;
    let mut sp = a.draft.speculator(&l, max_seq)?;
    let mut sampler = Sampler::new(cfg);
    let mut out = std::io::stdout().lock();
    output::print(&mut out, &prompt)?;
    let spec = Spec { limit, ignore_eos: a.ignore_eos, stops: &stops, feed_last: false, interrupt: None };
    let g = match sp.as_mut() {
        Some(sp) => generate::generate_drafted(&l.runner, &tok, &mut st, &mut sampler, sp, &ids, &spec, &mut |t| output::print(&mut out, t))?,
        None => generate::generate(&l.runner, &tok, &mut st, &mut sampler, &ids, &spec, rec.as_mut(), &mut |t| output::print(&mut out, t))?,
    };
    output::print(&mut out, "\n")?;
    a.dump.finish(rec)?;
    eprintln!(
        "\n[{}: prompt {}, generated {}, seed {seed}; stopped: {}]",
        l.name,
        generate::rate(ids.len(), g.prefill_s),
        generate::rate(g.tokens, g.gen_s),
        g.reason
    );
    if let Some(sp) = &sp {
        eprintln!("{}", crate::draft::end_line(a.draft.draft, sp.n_draft, sp.adapt.as_ref(), &sp.stats));
    }
    Ok(())
}

//! `pn serve`: the OpenAI-compatible HTTP server (pn-server, docs/server.md). This file
//! turns the flags into a server configuration and a model loader; the model loads on
//! the server's engine thread, so `/health` answers 503 until it is ready.

use crate::load;
use anyhow::{bail, Context, Result};
use clap::Args;
use pn_engine::prefix_cache::PrefixCacheConfig;
use pn_engine::slots::resolve_max_slots;
use pn_server::{Defaults, DraftSpec, ModelSpec, ServerConfig};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    /// Address to bind (127.0.0.1: this machine only; 0.0.0.0: every interface)
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the ready line names it)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Decode slots: sequences generated together. Default: $PN_MAX_SLOTS, else 16; capped
    /// when the states would not fit in memory
    #[arg(long)]
    slots: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every route but /health
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from a file (its first line)
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Context size per sequence in tokens (KV capacity). Default: $PN_MAX_SEQ, else 4096
    #[arg(long, alias = "max-seq")]
    ctx: Option<usize>,
    #[command(flatten)]
    sampling: crate::sampling::SamplingOpts,
    /// Allow browser requests from ORIGIN (repeatable; `*` allows any)
    #[arg(long)]
    cors: Vec<String>,
    /// Requests that may wait for a slot; more get 503 with Retry-After
    #[arg(long, default_value_t = ServerConfig::DEFAULT_QUEUE)]
    queue: usize,
    /// Largest request body in bytes (413 past it)
    #[arg(long, default_value_t = ServerConfig::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Seconds running streams may take to finish after SIGTERM / Ctrl-C
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
    /// The model id clients use (default: the file name without .gguf)
    #[arg(long)]
    alias: Option<String>,
    /// Prompt tokens per prefill pass between decode steps: a divisor of the prefix-cache
    /// interval (default: the interval, 256, which keeps prefills bitwise `pn run`'s)
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Do not reuse prompt prefixes across requests ($PN_PREFIX_CACHE_MB=0 does the same)
    #[arg(long)]
    no_prefix_cache: bool,
    /// Overlap each decode step with the next prefill pass (a worker thread runs the
    /// step); off by default: on 2 cores the two compete and the overlap is slower
    #[arg(long)]
    async_steps: bool,
    /// While more streams run than prompts wait, a decode step that also prefills may cost
    /// at most this many plain decode steps (measured as it runs; docs/server.md)
    #[arg(long, default_value_t = 1.5)]
    step_budget: f64,
    /// While no stream runs, prompts arriving together (a burst of clients) start
    /// streaming together: once the last is prefilled or this many prompt tokens were
    /// spent (0: each stream as soon as its prompt is done; docs/server.md)
    #[arg(long, default_value_t = pn_server::DEFAULT_WAVE_TOKENS)]
    wave_tokens: usize,
    /// `--draft lookup|mtp`: each sequence's drafts are verified in the step's pass
    /// (prompts then prefill in passes of their own; with mtp without the prefix cache)
    #[command(flatten)]
    draft: crate::draft::DraftOpts,
}

/// The id of a model file: its name without `.gguf`.
fn model_id(model: Option<&std::path::Path>) -> String {
    match model {
        None => load::DEFAULT_MODEL_NAME.split(' ').next().unwrap_or("pn-default").to_string(),
        Some(p) => p.file_name().map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string()).unwrap_or_else(|| p.display().to_string()),
    }
}

fn api_key(a: &ServeArgs) -> Result<Option<String>> {
    let key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => k.trim().to_string(),
        (None, Some(f)) => {
            let s = std::fs::read_to_string(f).with_context(|| format!("--api-key-file: cannot read {}", f.display()))?;
            s.lines().next().unwrap_or("").trim().to_string()
        }
        (None, None) => return Ok(None),
    };
    if key.is_empty() {
        bail!("--api-key: expected a non-empty key, found an empty one");
    }
    Ok(Some(key))
}

pub fn run(a: ServeArgs) -> Result<()> {
    let is_default = a.opts.model.is_none();
    let sampler = a.sampling.config(is_default)?;
    if a.queue == 0 {
        bail!("--queue: expected at least 1, found 0");
    }
    if !(a.grace.is_finite() && a.grace >= 0.0) {
        bail!("--grace: expected seconds ≥ 0, found {}", a.grace);
    }
    let cfg = ServerConfig {
        host: a.host.clone(),
        port: a.port,
        api_key: api_key(&a)?,
        cors: a.cors.clone(),
        queue: a.queue,
        max_body: a.max_body,
        grace: Duration::from_secs_f64(a.grace),
        // --seed -1 (or none): a fresh seed per request
        defaults: Defaults { sampler, seed: a.sampling.seed.and_then(|s| u64::try_from(s).ok()) },
    };
    let slots = resolve_max_slots(a.slots).map_err(anyhow::Error::msg)?;
    let state = load::state_config(&a.opts, a.ctx, None)?;
    let mut cache = PrefixCacheConfig::from_env().map_err(anyhow::Error::msg)?;
    if a.no_prefix_cache {
        cache.budget_bytes = 0;
    }
    let id = a.alias.clone().unwrap_or_else(|| model_id(a.opts.model.as_deref()));
    a.draft.check()?;
    if a.draft.draft_ref.is_some() {
        anyhow::bail!("--draft-ref: not a pn serve flag (a request gives its predicted output in its `prediction` field)");
    }
    let (mut opts, chunk, async_steps, step_budget, draft_opts, wave_tokens) = (a.opts.clone(), a.prefill_chunk, a.async_steps, a.step_budget, a.draft.clone(), a.wave_tokens);
    opts.ubatch.get_or_insert(load::SERVE_UBATCH);
    pn_server::serve(cfg, move || {
        let l = load::load(&opts)?;
        let tokenizer = load::tokenizer(&l)?;
        let prefill_chunk = chunk.unwrap_or(if cache.interval > 0 { cache.interval } else { l.runner.ubatch });
        let draft = draft_opts.factory(&l)?.map(|factory| DraftSpec { factory, n: draft_opts.n(), policy: draft_opts.draft_policy });
        Ok(ModelSpec { id, name: l.name, runner: l.runner, tokenizer, state, slots, cache, prefill_chunk, async_steps, step_budget, draft, wave_tokens })
    })
}

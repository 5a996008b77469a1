//! `pn batch`: many prompts through the decode slots (continuous batching).
//!
//! Every prompt (one per non-empty line) is prefilled through the prefix cache, bound to a
//! slot, and decoded with the other live sequences in one forward pass per step; a
//! finished sequence frees its slot for the next prompt. With async steps (default;
//! `PN_ASYNC=0` disables) the next prompts' prefills run while the step is in flight.
//! Outputs are one JSON line per prompt, in input order, on stdout; each sequence's
//! tokens are those `pn run` gives for its prompt alone (batch-invariant kernels, same
//! sampler settings, seed `--seed` + index). Aggregate tokens/s go to stderr.

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::async_step::async_enabled;
use pn_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use pn_engine::sampler::{Sampler, SamplerConfig};
use pn_engine::slots::{resolve_max_slots, slot_ladder};
use pn_engine::state::kv;
use pn_engine::tokenizer::{StreamDecoder, Tokenizer};
use pn_engine::{Runner, SeqState, SlotHandle, Slots};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct BatchArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    /// File with one prompt per line (`-` = stdin; empty lines are skipped; `\n` is not
    /// unescaped)
    #[arg(long)]
    prompts_file: std::path::PathBuf,
    /// Tokens to generate per prompt
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n: usize,
    /// Decode slots: sequences stepped together. Default: $PN_MAX_SLOTS, else 16; capped
    /// when the states would not fit in memory
    #[arg(long)]
    slots: Option<usize>,
    #[command(flatten)]
    sampling: crate::sampling::SamplingOpts,
    #[command(flatten)]
    ctx: load::ContextOpts,
    /// Do not stop at end-of-generation tokens
    #[arg(long)]
    ignore_eos: bool,
    /// Do not reuse shared prompt prefixes ($PN_PREFIX_CACHE_MB=0 does the same)
    #[arg(long)]
    no_prefix_cache: bool,
}

/// A sequence being generated.
struct Seq {
    index: usize,
    sampler: Sampler,
    dec: StreamDecoder,
    text: String,
    generated: usize,
    n_gen: usize,
    prompt_tokens: usize,
    cached: usize,
}

/// A prefilled sequence: its state and first sampled token, waiting for a slot.
struct Ready {
    seq: Seq,
    st: SeqState,
    next: u32,
}

struct Batch<'a> {
    runner: &'a Arc<Runner>,
    tok: &'a Tokenizer,
    prompts: &'a [String],
    ids: Vec<Vec<u32>>,
    cfg: SamplerConfig,
    state_cfg: kv::StateConfig,
    cache: PrefixCache,
    ignore_eos: bool,
    n: usize,
    spare: Vec<SeqState>,
    results: Vec<Option<String>>,
    printed: usize,
    prefill_tokens: usize,
    progress: indicatif::ProgressBar,
}

impl Batch<'_> {
    /// Prefill prompt `i` and sample its first token; None when it finished at once.
    fn prefill(&mut self, i: usize) -> Result<Option<Ready>> {
        let ids = &self.ids[i];
        let mut st = match self.spare.pop() {
            Some(s) => s,
            None => self.runner.alloc_state_within(&self.state_cfg, None)?.0,
        };
        let p = self.cache.prefill(self.runner, &mut st, ids)?;
        self.prefill_tokens += ids.len() - p.reused;
        let mut sampler = Sampler::new(SamplerConfig { seed: self.cfg.seed.wrapping_add(i as u64), ..self.cfg });
        sampler.observe(ids);
        let next = sampler.sample(load::finite(&p.logits)?);
        let ring = self.state_cfg.overflow == pn_ops::Overflow::Ring;
        let n_gen = if ring { self.n } else { self.n.min(self.state_cfg.max_seq - ids.len()) };
        let seq = Seq { index: i, sampler, dec: StreamDecoder::new(), text: String::new(), generated: 0, n_gen, prompt_tokens: ids.len(), cached: p.reused };
        let mut r = Ready { seq, st, next };
        Ok(if self.accept(&mut r.seq, next) { Some(r) } else { self.finish(r.seq, r.st, next)? })
    }

    /// Take sampled token `t`: false when the sequence is done (end of generation or
    /// length), as `pn run` decides.
    fn accept(&self, s: &mut Seq, t: u32) -> bool {
        if !self.ignore_eos && self.tok.is_eog(t) {
            return false;
        }
        s.text.push_str(&s.dec.push(self.tok, t));
        s.generated += 1;
        s.generated < s.n_gen
    }

    fn finish(&mut self, mut s: Seq, st: SeqState, last: u32) -> Result<Option<Ready>> {
        s.text.push_str(&s.dec.flush());
        let finish = if !self.ignore_eos && self.tok.is_eog(last) { "stop" } else { "length" };
        let line = serde_json::json!({
            "index": s.index,
            "prompt": self.prompts[s.index],
            "completion": s.text,
            "tokens": s.generated,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached,
            "finish": finish,
        });
        self.results[s.index] = Some(line.to_string());
        self.spare.push(st);
        self.progress.inc(1);
        self.print_ready()?;
        Ok(None)
    }

    /// Print the finished lines that are next in input order.
    fn print_ready(&mut self) -> Result<()> {
        let mut out = std::io::stdout().lock();
        while let Some(Some(l)) = self.results.get(self.printed) {
            self.progress.suspend(|| writeln!(out, "{l}"))?;
            self.printed += 1;
        }
        out.flush()?;
        Ok(())
    }
}

pub fn run(a: BatchArgs) -> Result<()> {
    if a.n == 0 {
        bail!("-n: expected at least 1 token to generate, found 0");
    }
    let text = crate::output::read_text(&a.prompts_file, "--prompts-file")?;
    let prompts: Vec<String> = text.lines().map(|l| l.trim_end_matches('\r').to_string()).filter(|l| !l.trim().is_empty()).collect();
    if prompts.is_empty() {
        bail!("--prompts-file: expected at least one prompt (one per line), found none");
    }
    let cfg = a.sampling.config(a.opts.model.is_none())?;
    let (max_seq, clamped) = kv::resolve_max_seq(a.ctx.max_seq)?;
    if let Some(w) = clamped {
        eprintln!("{w}");
    }
    let mut state_cfg = kv::StateConfig { max_seq, kv: kv::resolve_kv_type(a.opts.kv_type.as_deref())?, overflow: kv::resolve_overflow(a.opts.context_overflow.as_deref())? };
    let mut cache_cfg = PrefixCacheConfig::from_env().map_err(anyhow::Error::msg)?;
    if a.no_prefix_cache {
        cache_cfg.budget_bytes = 0;
    }
    let want = resolve_max_slots(a.slots).map_err(anyhow::Error::msg)?;
    load::check(&a.opts)?;
    let l = load::load(&a.opts)?;
    let tok = load::tokenizer(&l)?;
    let name = l.name.clone();
    // the memory ladder: KV format for one state, then the slot count
    let avail = kv::mem_available();
    let (kv_ty, note) = kv::choose_kv(l.runner.model(), max_seq, state_cfg.kv, avail)?;
    state_cfg.kv = kv_ty;
    note.into_iter().for_each(|n| eprintln!("{n}"));
    load::announce(&l, kv_ty, max_seq);
    let runner = Arc::new(l.runner);
    let arenas: u64 = runner.memory_reservation()?.iter().map(|(_, b)| *b as u64).sum();
    let (n_slots, note) = slot_ladder(runner.model(), &state_cfg, want, arenas + cache_cfg.budget_bytes as u64, avail)?;
    note.into_iter().for_each(|n| eprintln!("{n}"));

    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut v: Vec<u32> = if tok.add_bos() { tok.bos().into_iter().collect() } else { vec![] };
            v.extend(tok.encode(p, true));
            v
        })
        .collect();
    let ring = state_cfg.overflow == pn_ops::Overflow::Ring;
    // a prompt that cannot run gets its own error line; the others go on
    let mut results: Vec<Option<String>> = vec![None; prompts.len()];
    let mut failed = 0;
    for (i, v) in ids.iter().enumerate() {
        let err = if v.is_empty() {
            Some("the text tokenized to no tokens".to_string())
        } else if !ring && v.len() >= max_seq {
            Some(format!("the prompt has {} tokens but the context holds {max_seq} (raise --max-seq)", v.len()))
        } else {
            None
        };
        if let Some(e) = err {
            results[i] = Some(serde_json::json!({"index": i, "prompt": prompts[i], "error": e}).to_string());
            failed += 1;
        }
    }
    let asynchronous = async_enabled();
    let mut b = Batch {
        runner: &runner,
        tok: &tok,
        prompts: &prompts,
        ids,
        cfg,
        state_cfg,
        cache: PrefixCache::new(cache_cfg),
        ignore_eos: a.ignore_eos,
        n: a.n,
        spare: Vec::new(),
        printed: 0,
        prefill_tokens: 0,
        progress: crate::progress::bar(prompts.len() as u64, "batch", "prompts"),
        results,
    };
    b.progress.inc(failed as u64);
    b.print_ready()?;
    let mut pending: VecDeque<usize> = (0..prompts.len()).filter(|&i| b.results[i].is_none()).collect();
    let mut ready: VecDeque<Ready> = VecDeque::new();
    let mut slots = Slots::new(n_slots);
    let mut live: Vec<(SlotHandle, Seq, u32)> = Vec::new();
    let t0 = Instant::now();
    let (mut decode_s, mut steps, mut step_tokens) = (0f64, 0usize, 0usize);
    loop {
        // fill free slots with prefilled sequences
        while live.len() < n_slots {
            let r = match ready.pop_front() {
                Some(r) => r,
                None => match pending.pop_front() {
                    Some(i) => match b.prefill(i)? {
                        Some(r) => r,
                        None => continue,
                    },
                    None => break,
                },
            };
            live.push((slots.bind(r.st)?, r.seq, r.next));
        }
        if live.is_empty() {
            break;
        }
        let batch: Vec<(SlotHandle, u32)> = live.iter().map(|(h, _, t)| (*h, *t)).collect();
        let ts = Instant::now();
        let logits = if asynchronous {
            slots.step_begin_with(&runner, &batch, true)?;
            // overlap: prefill what the slots freed by this step will need next
            let finishing = live.iter().filter(|(_, s, _)| s.generated + 1 >= s.n_gen).count();
            while ready.len() < finishing.max(n_slots - live.len()).min(n_slots) {
                let Some(i) = pending.pop_front() else { break };
                if let Some(r) = b.prefill(i)? {
                    ready.push_back(r);
                }
            }
            slots.step_wait()?
        } else {
            slots.step(&runner, &batch)?
        };
        decode_s += ts.elapsed().as_secs_f64();
        steps += 1;
        step_tokens += batch.len();
        let mut still = Vec::with_capacity(live.len());
        for (row, (h, mut s, _)) in live.into_iter().enumerate() {
            let t = s.sampler.sample(load::finite(logits.row(row))?);
            if b.accept(&mut s, t) {
                still.push((h, s, t));
            } else {
                let st = slots.unbind(h)?;
                b.finish(s, st, t)?;
            }
        }
        live = still;
    }
    b.progress.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    let total_gen: usize = b.results.iter().flatten().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).map(|v| v["tokens"].as_u64().unwrap_or(0) as usize).sum();
    let ps = b.cache.stats;
    eprintln!(
        "[{name}: {} prompts, {n_slots} slots ({}), {} prompt tokens ({} from the prefix cache), {total_gen} generated tokens in {wall:.2}s: {:.1} tok/s aggregate; steps {:.1} tok/s over {steps} steps ({:.1} sequences/step)]",
        prompts.len(),
        if asynchronous { "async" } else { "sync" },
        b.prefill_tokens + ps.reused_tokens as usize,
        ps.reused_tokens,
        total_gen as f64 / wall.max(1e-9),
        step_tokens as f64 / decode_s.max(1e-9),
        step_tokens as f64 / steps.max(1) as f64,
    );
    if failed > 0 {
        bail!("{failed} of {} prompts could not run (their lines hold the \"error\")", prompts.len());
    }
    Ok(())
}

//! `pn batch`: many prompts through the decode slots (continuous batching).
//!
//! Every prompt (one per non-empty line) is prefilled through the prefix cache, bound to a
//! slot, and decoded with the other live sequences in one forward pass per step; a
//! finished sequence frees its slot for the next prompt. With synchronous steps (the CPU
//! default) a new prompt is prefilled in chunks of `--prefill-chunk` tokens inside the
//! decode steps (mixed passes, `Slots::step_mixed`), so the live sequences keep
//! streaming; with async steps (a resident backend, or `PN_ASYNC=1`) the next prompts'
//! prefills run while the step is in flight.
//! Outputs are one JSON line per prompt, in input order, on stdout; each sequence's
//! tokens are those `pn run` gives for its prompt alone (batch-invariant kernels, same
//! sampler settings, seed `--seed` + index). Aggregate tokens/s go to stderr.

use crate::load;
use anyhow::{bail, Result};
use clap::Args;
use pn_engine::async_step::async_for;
use pn_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use pn_engine::sampler::{Sampler, SamplerConfig};
use pn_engine::slots::{resolve_max_slots, slot_ladder};
use pn_engine::spec::slots::SlotRound;
use pn_engine::spec::{Drafter, SpecStats};
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
    /// Most prompt tokens one pass takes along beside the decode tokens (synchronous
    /// steps: new prompts are prefilled in chunks inside the steps of the live sequences,
    /// mixed passes); bounded by --ubatch
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// `--draft lookup|mtp`: each slot verifies its own drafts (prompt lookup, or its own
    /// MTP drafter) in the step's pass (prompts are then prefilled alone, not in chunks
    /// inside the steps; with mtp without the prefix cache: the block needs every prompt
    /// token's hidden row)
    #[command(flatten)]
    draft: crate::draft::DraftOpts,
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
    /// With --draft: every token fed (prompt, then generated) and the draft counters.
    hist: Vec<u32>,
    stats: SpecStats,
    drafter: Option<Drafter>,
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
    /// `--draft lookup|mtp`: sequences keep their token history and a drafter.
    drafting: Option<pn_engine::spec::DraftFactory>,
    /// `--draft-ref`: the predicted output every lookup drafter also matches.
    reference: Option<std::sync::Arc<[u32]>>,
    printed: usize,
    prefill_tokens: usize,
    progress: indicatif::ProgressBar,
}

/// A prompt being prefilled in chunks inside the decode steps (mixed passes).
struct Fill {
    i: usize,
    st: SeqState,
    /// Tokens of the prompt in `st` so far.
    p: usize,
    reused: usize,
}

impl Batch<'_> {
    fn state(&mut self) -> Result<SeqState> {
        Ok(match self.spare.pop() {
            Some(s) => s,
            None => self.runner.alloc_state_within(&self.state_cfg, None)?.0,
        })
    }

    /// Prefill prompt `i` alone and sample its first token; None when it finished at once.
    fn prefill(&mut self, i: usize) -> Result<Option<Ready>> {
        let mut st = self.state()?;
        if let Some(f @ pn_engine::spec::DraftFactory::Mtp(_)) = &self.drafting {
            // the MTP drafter needs every prompt token's hidden row: a cached prefix
            // only with its rows
            let mut d = f.drafter(self.state_cfg.max_seq);
            let (p, rows) = self.cache.prefill_hidden(self.runner, &mut st, &self.ids[i])?;
            if let Drafter::Mtp(m) = &mut d {
                m.observe_hidden(&rows);
            }
            self.prefill_tokens += self.ids[i].len() - p.reused;
            return self.admit(i, st, &p.logits, p.reused, Some(d));
        }
        let p = self.cache.prefill(self.runner, &mut st, &self.ids[i])?;
        self.prefill_tokens += self.ids[i].len() - p.reused;
        self.admit(i, st, &p.logits, p.reused, None)
    }

    /// Start prompt `i` as a filling sequence: its cached prefix restored, the rest to
    /// be fed in chunks of the next steps ([`Batch::feed`]).
    fn begin_fill(&mut self, i: usize) -> Result<Fill> {
        let mut st = self.state()?;
        let reused = self.cache.begin(self.runner, &mut st, &self.ids[i])?;
        Ok(Fill { i, st, p: reused, reused })
    }

    /// Whether prompt `i` should wait for a prompt being filled: it shares at least a
    /// snapshot interval of prefix with it, which the prefix cache serves once that
    /// prefill has passed there.
    fn waits_for_cache(&self, i: usize, filling: &[Fill]) -> bool {
        let iv = self.cache.config().interval;
        let on = self.cache.config().budget_bytes > 0 && iv > 0;
        on && filling.iter().any(|f| self.ids[f.i].iter().zip(&self.ids[i]).take_while(|(a, b)| a == b).count() >= iv)
    }

    /// The next chunk of a filling sequence: at most `max` tokens (none for 0), never past the
    /// prefix cache's next cut (its snapshots stay where a cold prefill takes them).
    fn chunk(&self, f: &Fill, max: usize) -> std::ops::Range<usize> {
        let cut = self.cache.next_cut(self.runner, &self.ids[f.i], f.p);
        f.p..cut.min(f.p + max)
    }

    /// After a pass that fed `f` up to `f.st.pos`: snapshots for the prefix cache and,
    /// at the end of the prompt, its first token (`last`: the chunk's last logits row).
    fn fed(&mut self, mut f: Fill, last: &[f32]) -> Result<Result<Option<Ready>, Fill>> {
        self.prefill_tokens += f.st.pos - f.p;
        f.p = f.st.pos;
        self.cache.passed(&self.ids[f.i], &f.st);
        if f.p < self.ids[f.i].len() {
            return Ok(Err(f));
        }
        Ok(Ok(self.admit(f.i, f.st, last, f.reused, None)?))
    }

    /// Sample the first token of prompt `i` from its prefill's last logits.
    fn admit(&mut self, i: usize, st: SeqState, logits: &[f32], reused: usize, drafter: Option<Drafter>) -> Result<Option<Ready>> {
        let ids = &self.ids[i];
        let mut sampler = Sampler::new(SamplerConfig { seed: self.cfg.seed.wrapping_add(i as u64), ..self.cfg });
        sampler.observe(ids);
        let next = sampler.sample(load::finite(logits)?);
        let ring = self.state_cfg.overflow == pn_ops::Overflow::Ring;
        let n_gen = if ring { self.n } else { self.n.min(self.state_cfg.max_seq - ids.len()) };
        let hist = if self.drafting.is_some() { ids.clone() } else { Vec::new() };
        let drafter = drafter.or_else(|| Some(self.drafting.as_ref()?.drafter_with(self.state_cfg.max_seq, self.reference.as_ref())));
        let seq = Seq { index: i, sampler, dec: StreamDecoder::new(), text: String::new(), generated: 0, n_gen, prompt_tokens: ids.len(), cached: reused, hist, stats: SpecStats::default(), drafter };
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
    if a.prefill_chunk == 0 {
        bail!("--prefill-chunk: expected at least 1 token, found 0");
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
    a.draft.check()?;
    let l = load::load(&a.opts)?;
    let drafting = a.draft.factory(&l)?;
    let reference = a.draft.reference(&l)?;
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
    let asynchronous = async_for(&runner) && drafting.is_none();
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
        drafting,
        reference,
    };
    b.progress.inc(failed as u64);
    b.print_ready()?;
    let mut pending: VecDeque<usize> = (0..prompts.len()).filter(|&i| b.results[i].is_none()).collect();
    let mut ready: VecDeque<Ready> = VecDeque::new();
    let mut slots = Slots::new(n_slots);
    let mut live: Vec<(SlotHandle, Seq, u32)> = Vec::new();
    let t0 = Instant::now();
    let (mut decode_s, mut steps, mut step_tokens) = (0f64, 0usize, 0usize);
    let mut spec_total = SpecStats::default();
    // --draft-policy adaptive: which rounds of k slots draft (pn_engine spec/adapt.rs)
    let mut adapt = a.draft.draft_policy.tracker();
    // prompts being prefilled in chunks inside the steps (synchronous steps)
    let mut filling: Vec<Fill> = Vec::new();
    loop {
        // fill free slots with prefilled sequences
        while live.len() < n_slots {
            let r = match ready.pop_front() {
                Some(r) => r,
                None if asynchronous || b.drafting.is_some() => match pending.pop_front() {
                    Some(i) => match b.prefill(i)? {
                        Some(r) => r,
                        None => continue,
                    },
                    None => break,
                },
                None => break,
            };
            live.push((slots.bind(r.st)?, r.seq, r.next));
        }
        // in slot order: the same slots, the same sequence table (a slot's row keeps its
        // state ids), so a device replays its captured step as sequences come and go
        live.sort_by_key(|(h, _, _)| h.slot());
        // synchronous: start prompts for the free slots, and one ahead of a slot that
        // frees up (its prefill then rides along in the decode passes)
        while !asynchronous && b.drafting.is_none() && live.len() + ready.len() + filling.len() < n_slots + 1 {
            let Some(&i) = pending.front() else { break };
            if b.waits_for_cache(i, &filling) {
                break;
            }
            pending.pop_front();
            filling.push(b.begin_fill(i)?);
        }
        if live.is_empty() && filling.is_empty() {
            break;
        }
        if b.drafting.is_some() {
            // one pass: every slot's pending token and its own drafts (spec::slots)
            let ts = Instant::now();
            let mut items: Vec<SlotRound<'_>> = live
                .iter_mut()
                .map(|(h, s, t)| SlotRound { handle: *h, history: &s.hist, pending: *t, sampler: &mut s.sampler, stats: &mut s.stats, drafter: s.drafter.as_mut().expect("drafting") })
                .collect();
            let k = items.len();
            let drafting = adapt.as_mut().is_none_or(|p| p.draft(k));
            let caught = |items: &[SlotRound<'_>]| pn_engine::spec::adapt::caught_up(items.iter().map(|it| &*it.drafter));
            let before = caught(&items);
            let res = pn_engine::spec::slots::round(&mut slots, &runner, if drafting { a.draft.n() } else { 0 }, &mut items)?;
            let after = caught(&items);
            drop(items);
            if let Some(p) = &mut adapt {
                let tokens = k + res.iter().map(|(acc, _)| acc.len()).sum::<usize>();
                p.record(k, drafting, tokens, ts.elapsed().as_secs_f64(), pn_engine::spec::adapt::since(before, after));
            }
            decode_s += ts.elapsed().as_secs_f64();
            steps += 1;
            step_tokens += live.len();
            let mut still = Vec::with_capacity(live.len());
            for ((h, mut s, t), (acc, next)) in live.into_iter().zip(res) {
                s.hist.push(t);
                s.hist.extend_from_slice(&acc);
                step_tokens += acc.len();
                let (mut alive, mut last) = (true, t);
                for &d in acc.iter().chain([&next]) {
                    last = d;
                    if !b.accept(&mut s, d) {
                        alive = false;
                        break;
                    }
                }
                if alive {
                    still.push((h, s, next));
                } else {
                    spec_total.add(&s.stats);
                    let st = slots.unbind(h)?;
                    b.finish(s, st, last)?;
                }
            }
            live = still;
            continue;
        }
        let batch: Vec<(SlotHandle, u32)> = live.iter().map(|(h, _, t)| (*h, *t)).collect();
        let ts = Instant::now();
        // prefill tokens that ride along with the decode tokens in one pass (ubatch)
        let mut room = a.prefill_chunk.min(runner.ubatch.saturating_sub(batch.len()));
        let logits = if !filling.is_empty() && room > 0 {
            // a mixed pass: the decode tokens and the next chunks of the filling prompts
            let ranges: Vec<std::ops::Range<usize>> = filling
                .iter()
                .map(|f| {
                    let r = b.chunk(f, room);
                    room -= r.len();
                    r
                })
                .collect();
            let mut chunks: Vec<(&mut SeqState, &[u32])> =
                filling.iter_mut().zip(&ranges).filter(|(_, r)| !r.is_empty()).map(|(f, r)| (&mut f.st, &b.ids[f.i][r.clone()])).collect();
            let l = slots.step_mixed(&runner, &batch, &mut chunks)?;
            drop(chunks);
            // a row per decode token, then one per chunk (its last token's)
            let mut row = batch.len();
            for f in std::mem::take(&mut filling) {
                let n = f.st.pos - f.p;
                if n == 0 {
                    filling.push(f);
                    continue;
                }
                row += 1;
                match b.fed(f, l.row(row - 1))? {
                    Ok(r) => ready.extend(r),
                    Err(f) => filling.push(f),
                }
            }
            l
        } else if asynchronous {
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
        if batch.is_empty() {
            continue;
        }
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
    if b.drafting.is_some() {
        eprintln!("{}", crate::draft::end_line(a.draft.draft, a.draft.n(), adapt.as_ref(), &spec_total));
    }
    if failed > 0 {
        bail!("{failed} of {} prompts could not run (their lines hold the \"error\")", prompts.len());
    }
    Ok(())
}

//! `pn chat`: an interactive multi-turn chat. The conversation state stays in the model:
//! each turn feeds only the text the chat template adds since the last turn.
//! Ctrl-C stops the current answer (at the prompt: drops the line); Ctrl-D or `/bye`
//! quits; `/help` lists the commands. Answers go to stdout, everything else to stderr.

use crate::chat_input::{turn_text, Input, Reader};
use crate::generate::{self, Spec};
use crate::{load, output, prompt};
use anyhow::{bail, Context, Result};
use clap::Args;
use pn_engine::chat::ChatMessage;
use pn_engine::conversation::Conversation;
use pn_engine::sampler::{Sampler, SamplerConfig};
use pn_engine::state::kv::StateConfig;
use pn_engine::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    /// System prompt
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer (-1: until end of text or a full context)
    #[arg(short = 'n', long = "n-predict", default_value_t = 512, allow_negative_numbers = true)]
    n: i64,
    /// End an answer when it contains this (repeatable); it is not shown
    #[arg(long = "stop", value_name = "STR", allow_hyphen_values = true)]
    stop: Vec<String>,
    #[command(flatten)]
    sampling: crate::sampling::SamplingOpts,
    #[command(flatten)]
    ctx: load::ContextOpts,
    #[command(flatten)]
    draft: crate::draft::DraftOpts,
}

const HELP: &str = "commands:
  /help              this list
  /bye               quit (also /exit, /quit, Ctrl-D)
  /reset             start a new conversation (keeps the system prompt)
  /system TEXT       set the system prompt (an empty TEXT removes it)
  /save FILE         write the conversation as JSON
  /load FILE         continue a conversation saved with /save
  /set               show the settings
  /set NAME VALUE    change one: temp, top_k, top_p, min_p, repeat_penalty, seed, n (-1 = no limit)
input: Enter sends; Alt-Enter adds a line; a paste stays one turn; a block between
two \"\"\" lines is one turn. Ctrl-C stops an answer or drops the line being typed.";

/// A conversation on disk (`/save`, `/load`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    model: String,
    messages: Vec<ChatMessage>,
}

struct Session<'a> {
    l: &'a load::Loaded,
    tok: Tokenizer,
    conv: Option<Conversation>,
    cfg: SamplerConfig,
    sampler: Sampler,
    limit: Option<usize>,
    stops: Vec<String>,
    /// `--draft`: the conversation's speculator (None: plain decoding), remade on restart.
    draft: crate::draft::DraftOpts,
    sp: Option<pn_engine::spec::Speculator>,
}

enum Flow {
    Continue,
    Quit,
}

impl Session<'_> {
    fn conv(&mut self) -> &mut Conversation {
        self.conv.as_mut().expect("a conversation is always set")
    }

    /// Start over from `messages` (the state is reused; the next turn feeds them all).
    fn restart(&mut self, messages: Vec<ChatMessage>) {
        let mut st = self.conv.take().expect("a conversation is always set").st;
        st.reset();
        let max_seq = st.max_seq;
        let mut c = Conversation::new(None, st);
        c.messages = messages;
        self.conv = Some(c);
        if self.sp.is_some() {
            // a fresh sequence: a fresh drafter (its context and MTP cache start over)
            match self.draft.speculator(self.l, max_seq) {
                Ok(sp) => self.sp = sp,
                Err(e) => output::report_error(&e),
            }
        }
    }

    fn system_messages(&mut self) -> Vec<ChatMessage> {
        self.conv().messages.iter().filter(|m| m.role == "system").cloned().collect()
    }

    /// `/set NAME VALUE`: the sampler restarts with the new settings.
    fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let f = || value.parse::<f32>().with_context(|| format!("/set {name}: expected a number, found {value:?}"));
        let mut cfg = self.cfg.clone();
        match name {
            "temp" | "temperature" => cfg.temperature = f()?,
            "top_k" | "top-k" => cfg.top_k = value.parse().with_context(|| format!("/set {name}: expected a count ≥ 0, found {value:?}"))?,
            "top_p" | "top-p" => cfg.top_p = f()?,
            "min_p" | "min-p" => cfg.min_p = f()?,
            "repeat_penalty" | "repeat-penalty" => cfg.repeat_penalty = f()?,
            "seed" => cfg.seed = value.parse().with_context(|| format!("/set seed: expected a value ≥ 0, found {value:?}"))?,
            "n" | "n_predict" => {
                let n: i64 = value.parse().with_context(|| format!("/set n: expected a token count or -1, found {value:?}"))?;
                self.limit = crate::cmd_run::token_limit(n, false)?;
                return Ok(());
            }
            _ => bail!("/set: expected one of temp, top_k, top_p, min_p, repeat_penalty, seed, n; found {name:?}"),
        }
        cfg.validate().map_err(anyhow::Error::msg)?;
        self.sampler = Sampler::new(cfg.clone());
        self.cfg = cfg;
        Ok(())
    }

    fn settings(&self) -> String {
        let c = &self.cfg;
        let n = self.limit.map_or("-1 (no limit)".to_string(), |n| n.to_string());
        format!("temp {} top_k {} top_p {} min_p {} repeat_penalty {} seed {} n {n}", c.temperature, c.top_k, c.top_p, c.min_p, c.repeat_penalty, c.seed)
    }

    /// A `/command` line.
    fn command(&mut self, line: &str) -> Result<Flow> {
        let (cmd, arg) = line.split_once(char::is_whitespace).map_or((line, ""), |(c, a)| (c, a.trim()));
        match cmd {
            "/help" | "/?" => eprintln!("{HELP}"),
            "/bye" | "/exit" | "/quit" => return Ok(Flow::Quit),
            "/reset" | "/clear" => {
                let sys = self.system_messages();
                self.restart(sys);
                eprintln!("(conversation cleared)");
            }
            "/system" => {
                // the template re-renders from the top: the next turn feeds everything again
                let mut msgs: Vec<ChatMessage> = self.conv().messages.iter().filter(|m| m.role != "system").cloned().collect();
                if !arg.is_empty() {
                    msgs.insert(0, ChatMessage::system(arg));
                }
                self.restart(msgs);
                eprintln!("{}", if arg.is_empty() { "(system prompt removed)" } else { "(system prompt set)" });
            }
            "/save" if !arg.is_empty() => {
                let saved = Saved { model: self.l.name.clone(), messages: self.conv().messages.clone() };
                std::fs::write(arg, serde_json::to_string_pretty(&saved)? + "\n").with_context(|| format!("/save: cannot write {arg}"))?;
                eprintln!("(saved {} messages to {arg})", saved.messages.len());
            }
            "/load" if !arg.is_empty() => {
                let text = std::fs::read_to_string(arg).with_context(|| format!("/load: cannot read {arg}"))?;
                let saved: Saved = serde_json::from_str(&text).with_context(|| format!("/load {arg}: expected a conversation saved with /save"))?;
                let n = saved.messages.len();
                self.restart(saved.messages);
                eprintln!("(loaded {n} messages from {arg}; the next turn feeds them)");
            }
            "/save" | "/load" => bail!("{cmd}: expected a file name"),
            "/set" if arg.is_empty() => eprintln!("{}", self.settings()),
            "/set" => {
                let mut it = arg.split_whitespace();
                match (it.next(), it.next(), it.next()) {
                    (Some(name), Some(value), None) => self.set(name, value)?,
                    _ => bail!("/set: expected NAME VALUE (e.g. /set temp 0.7), found {arg:?}"),
                }
                eprintln!("{}", self.settings());
            }
            _ => bail!("{cmd}: unknown command (/help lists them)"),
        }
        Ok(Flow::Continue)
    }

    /// One user turn and its streamed answer.
    fn turn(&mut self, text: &str, interrupt: &AtomicBool) -> Result<()> {
        let conv = self.conv.as_mut().expect("a conversation is always set");
        let ids = conv.user_turn(&self.tok, text)?;
        if !conv.st.fits(ids.len() + 1) {
            conv.cancel_user_turn();
            let (pos, max) = (conv.st.pos, conv.st.max_seq);
            bail!("context full: the conversation would need {} tokens but the context holds {max}; /reset to start over", pos + ids.len() + 1);
        }
        interrupt.store(false, Ordering::SeqCst);
        let spec = Spec { limit: self.limit, ignore_eos: false, stops: &self.stops, feed_last: true, interrupt: Some(interrupt) };
        let mut out = std::io::stdout().lock();
        let mut last = '\n';
        let mut emit = |t: &str| {
            last = t.chars().last().unwrap_or(last);
            output::print(&mut out, t)
        };
        let g = match self.sp.as_mut() {
            Some(sp) => generate::generate_drafted(&self.l.runner, &self.tok, &mut conv.st, &mut self.sampler, sp, &ids, &spec, &mut emit)?,
            None => generate::generate(&self.l.runner, &self.tok, &mut conv.st, &mut self.sampler, &ids, &spec, None, &mut emit)?,
        };
        if last != '\n' {
            output::print(&mut out, "\n")?;
        }
        // the state holds every token shown (and a matched stop string): record that text
        conv.assistant_turn(g.text);
        eprintln!("[{}; prompt {}; stopped: {}]", generate::rate(g.tokens, g.gen_s), generate::rate(ids.len(), g.prefill_s), g.reason);
        if let Some(sp) = &self.sp {
            eprintln!("{}", crate::draft::end_line(self.draft.draft, sp.n_draft, sp.adapt.as_ref(), &sp.stats));
        }
        Ok(())
    }
}

/// The first lines: model, template, and what the built-in model is.
fn banner(l: &load::Loaded, tok: &Tokenizer) {
    let template = match tok.chat_template() {
        None => "ChatML (the GGUF has no chat template)".to_string(),
        Some(t) if t.contains("<|im_start|>") => format!("the GGUF's (ChatML-style, {} chars)", t.len()),
        Some(t) => format!("the GGUF's ({} chars)", t.len()),
    };
    eprintln!("pn chat: {}\n  template: {template}", l.name);
    if l.is_default {
        eprintln!("  note: the built-in model is a small code-completion model trained on Python, not a chat\n  model: expect code continuations rather than answers (--model runs a chat model)");
    }
    eprintln!("  /help lists commands; Ctrl-C stops an answer; Ctrl-D or /bye quits");
}

pub fn run(a: ChatArgs) -> Result<()> {
    let limit = crate::cmd_run::token_limit(a.n, false)?;
    let stops = prompt::stops(&a.stop, false)?;
    let cfg = a.sampling.config(a.opts.model.is_none())?;
    let state_cfg: StateConfig = load::state_config(&a.opts, a.ctx.max_seq, None)?;
    load::check(&a.opts)?;
    a.draft.check()?;
    let l = load::load(&a.opts)?;
    let tok = load::tokenizer(&l)?;
    let interrupt = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupt.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))?;
    }
    let st = load::first_state(&l, &state_cfg)?;
    let sp = a.draft.speculator(&l, st.max_seq)?;
    banner(&l, &tok);
    let conv = Some(Conversation::new(a.system.as_deref(), st));
    let mut s = Session { l: &l, tok, conv, sampler: Sampler::new(cfg.clone()), cfg, limit, stops, draft: a.draft.clone(), sp };
    let mut reader = Reader::new()?;
    loop {
        let line = match reader.read(">>> ")? {
            Input::Line(l) => l,
            Input::Interrupted => {
                eprintln!("(Ctrl-D or /bye quits)");
                continue;
            }
            Input::Eof => return Ok(()),
        };
        let text = turn_text(&line);
        if text.trim().is_empty() {
            continue;
        }
        let res = if text.starts_with('/') && !line.trim_start().starts_with(crate::chat_input::BLOCK) {
            match s.command(text.trim()) {
                Ok(Flow::Quit) => return Ok(()),
                Ok(Flow::Continue) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            s.turn(&text, &interrupt)
        };
        // a bad command or a full context is reported and the chat goes on
        if let Err(e) = res {
            if output::is_broken_pipe(&e) {
                return Err(e);
            }
            output::report_error(&e);
        }
    }
}
